// Kept by hand in the layout of `diesel print-schema` (there is no diesel.toml); the test
// tests/integration/migrations.rs checks it against the migrated database.

pub mod sql_types {
    /// PostgreSQL's `tsvector` (read only in SQL text, never into Rust).
    #[derive(diesel::query_builder::QueryId, diesel::sql_types::SqlType)]
    #[diesel(postgres_type(name = "tsvector"))]
    pub struct Tsvector;
}

diesel::table! {
    access_tokens (token_hash) {
        token_hash -> Bytea,
        user_id -> Text,
        device_id -> Text,
        expires_ts -> Nullable<Int8>,
        refresh_token_hash -> Nullable<Bytea>,
        created_ts -> Int8,
    }
}

diesel::table! {
    account_data (user_id, room_id, data_type) {
        user_id -> Text,
        room_id -> Text,
        data_type -> Text,
        content -> Jsonb,
        stream_ordering -> Int8,
    }
}

diesel::table! {
    backup_keys (user_id, version, room_id, session_id) {
        user_id -> Text,
        version -> Int8,
        room_id -> Text,
        session_id -> Text,
        first_message_index -> Int8,
        forwarded_count -> Int8,
        is_verified -> Bool,
        session_data -> Jsonb,
    }
}

diesel::table! {
    backup_versions (user_id, version) {
        user_id -> Text,
        version -> Int8,
        algorithm -> Text,
        auth_data -> Jsonb,
        etag -> Int8,
        deleted -> Bool,
    }
}

diesel::table! {
    cross_signing_keys (user_id, key_type) {
        user_id -> Text,
        key_type -> Text,
        key -> Jsonb,
    }
}

diesel::table! {
    device_keys (user_id, device_id) {
        user_id -> Text,
        device_id -> Text,
        keys -> Jsonb,
    }
}

diesel::table! {
    device_list_changes (stream_ordering) {
        stream_ordering -> Int8,
        user_id -> Text,
    }
}

diesel::table! {
    fallback_keys (user_id, device_id, algorithm) {
        user_id -> Text,
        device_id -> Text,
        algorithm -> Text,
        key_id -> Text,
        key -> Jsonb,
        used -> Bool,
    }
}

diesel::table! {
    key_signatures (target_user_id, target_key_id, signer_user_id, signer_key_id) {
        target_user_id -> Text,
        target_key_id -> Text,
        signer_user_id -> Text,
        signer_key_id -> Text,
        signature -> Text,
    }
}

diesel::table! {
    media (media_id) {
        media_id -> Text,
        uploader -> Text,
        content_type -> Nullable<Text>,
        filename -> Nullable<Text>,
        size -> Nullable<Int8>,
        sha256 -> Nullable<Text>,
        created_ts -> Int8,
        expires_ts -> Nullable<Int8>,
        quarantined_by -> Nullable<Text>,
    }
}

diesel::table! {
    media_thumbnails (media_id, width, height, method) {
        media_id -> Text,
        width -> Int4,
        height -> Int4,
        method -> Text,
        content_type -> Text,
        sha256 -> Text,
        size -> Int8,
    }
}

diesel::table! {
    one_time_keys (user_id, device_id, key_id) {
        user_id -> Text,
        device_id -> Text,
        algorithm -> Text,
        key_id -> Text,
        key -> Jsonb,
    }
}

diesel::table! {
    to_device_inbox (user_id, device_id, stream_ordering) {
        user_id -> Text,
        device_id -> Text,
        stream_ordering -> Int8,
        sender -> Text,
        event_type -> Text,
        content -> Jsonb,
    }
}

diesel::table! {
    to_device_txns (user_id, device_id, txn_id) {
        user_id -> Text,
        device_id -> Text,
        txn_id -> Text,
        created_ts -> Int8,
    }
}

diesel::table! {
    devices (user_id, device_id) {
        user_id -> Text,
        device_id -> Text,
        display_name -> Nullable<Text>,
        last_seen_ts -> Nullable<Int8>,
        last_seen_ip -> Nullable<Text>,
        created_ts -> Int8,
        hidden -> Bool,
    }
}

diesel::table! {
    filters (user_id, filter_id) {
        user_id -> Text,
        filter_id -> Int8,
        content -> Jsonb,
    }
}

diesel::table! {
    profile_fields (user_id, field_name) {
        user_id -> Text,
        field_name -> Text,
        value -> Jsonb,
    }
}

diesel::table! {
    receipts (room_id, user_id, receipt_type, thread_id) {
        room_id -> Text,
        user_id -> Text,
        receipt_type -> Text,
        thread_id -> Text,
        event_id -> Text,
        event_stream -> Int8,
        ts -> Int8,
        stream_ordering -> Int8,
    }
}

diesel::table! {
    refresh_tokens (token_hash) {
        token_hash -> Bytea,
        user_id -> Text,
        device_id -> Text,
        created_ts -> Int8,
    }
}

diesel::table! {
    registration_tokens (token) {
        token -> Text,
        uses_allowed -> Nullable<Int4>,
        pending -> Int4,
        completed -> Int4,
        expiry_ts -> Nullable<Int8>,
        created_ts -> Int8,
    }
}

diesel::table! {
    uia_sessions (session_id) {
        session_id -> Text,
        user_id -> Nullable<Text>,
        completed_stages -> Jsonb,
        registration_token -> Nullable<Text>,
        created_ts -> Int8,
        operation -> Nullable<Text>,
    }
}

diesel::table! {
    user_reports (report_id) {
        report_id -> Int8,
        received_ts -> Int8,
        target_user_id -> Text,
        user_id -> Text,
        reason -> Text,
    }
}

diesel::table! {
    users (user_id) {
        user_id -> Text,
        localpart -> Text,
        password_hash -> Nullable<Text>,
        is_admin -> Bool,
        deactivated -> Bool,
        created_ts -> Int8,
        shadow_banned -> Bool,
        erased -> Bool,
        nid -> Int4,
    }
}

diesel::table! {
    user_ratelimit_overrides (user_id) {
        user_id -> Text,
        messages_per_second -> Int8,
        burst_count -> Int8,
    }
}

diesel::table! {
    blocked_rooms (room_id) {
        room_id -> Text,
        blocked_by -> Text,
        created_ts -> Int8,
    }
}

diesel::table! {
    admin_room_deletions (delete_id) {
        delete_id -> Text,
        room_id -> Text,
        status -> Text,
        error -> Nullable<Text>,
        result -> Nullable<Jsonb>,
        created_ts -> Int8,
    }
}

diesel::table! {
    admin_history_purges (purge_id) {
        purge_id -> Text,
        room_id -> Text,
        status -> Text,
        error -> Nullable<Text>,
        created_ts -> Int8,
    }
}

diesel::table! {
    event_reports (report_id) {
        report_id -> Int8,
        received_ts -> Int8,
        room_id -> Text,
        event_id -> Text,
        user_id -> Text,
        reason -> Nullable<Text>,
        score -> Nullable<Int8>,
        content -> Jsonb,
    }
}

diesel::table! {
    event_txns (user_id, device_id, txn_id) {
        user_id -> Text,
        device_id -> Text,
        txn_id -> Text,
        event_id -> Text,
        created_ts -> Int8,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::sql_types::Tsvector;

    events (event_id) {
        event_id -> Text,
        room_id -> Text,
        stream_ordering -> Int8,
        depth -> Int8,
        sender -> Text,
        event_type -> Text,
        state_key -> Nullable<Text>,
        origin_server_ts -> Int8,
        pdu -> Jsonb,
        state_group -> Nullable<Int8>,
        redacted_by -> Nullable<Text>,
        outlier -> Bool,
        rejected_reason -> Nullable<Text>,
        soft_failed -> Bool,
        body_vector -> Tsvector,
    }
}

diesel::table! {
    room_aliases (room_alias) {
        room_alias -> Text,
        room_id -> Text,
        creator -> Text,
        created_ts -> Int8,
    }
}

diesel::table! {
    room_current_state (room_id, event_type, state_key) {
        room_id -> Text,
        event_type -> Text,
        state_key -> Text,
        event_id -> Text,
    }
}

diesel::table! {
    room_member_counts (room_id, membership) {
        room_id -> Text,
        membership -> Text,
        members -> Int8,
    }
}

diesel::table! {
    room_memberships (room_id, user_id) {
        room_id -> Text,
        user_id -> Text,
        membership -> Text,
        event_id -> Text,
        stream_ordering -> Int8,
        forgotten -> Bool,
        display_name -> Nullable<Text>,
        avatar_url -> Nullable<Text>,
    }
}

diesel::table! {
    event_relations (event_id) {
        event_id -> Text,
        relates_to -> Text,
        rel_type -> Text,
        room_id -> Text,
        sender -> Text,
        event_type -> Text,
        aggregation_key -> Nullable<Text>,
        stream_ordering -> Int8,
    }
}

diesel::table! {
    event_push_actions (user_nid, room_nid, stream_ordering) {
        user_nid -> Int4,
        room_nid -> Int4,
        stream_ordering -> Int8,
        notify -> Bool,
        highlight -> Bool,
        unread -> Bool,
        default_sound -> Bool,
        thread_id -> Text,
        actions -> Nullable<Jsonb>,
    }
}

diesel::table! {
    unread_count_summaries (user_nid, room_nid) {
        user_nid -> Int4,
        room_nid -> Int4,
        read_from -> Int8,
        counted_to -> Int8,
        redactions -> Int8,
        notifications -> Int8,
        highlights -> Int8,
        unread -> Int8,
    }
}

diesel::table! {
    openid_tokens (token_hash) {
        token_hash -> Bytea,
        user_id -> Text,
        expires_ts -> Int8,
    }
}

diesel::table! {
    presence (user_id) {
        user_id -> Text,
        state -> Text,
        status_msg -> Nullable<Text>,
        last_active_ts -> Int8,
        last_seen_ts -> Int8,
        stream_ordering -> Int8,
    }
}

diesel::table! {
    pushers (user_id, app_id, pushkey) {
        user_id -> Text,
        app_id -> Text,
        pushkey -> Text,
        kind -> Text,
        app_display_name -> Text,
        device_display_name -> Text,
        profile_tag -> Nullable<Text>,
        lang -> Text,
        data -> Jsonb,
        device_id -> Nullable<Text>,
        created_ts -> Int8,
        last_stream_ordering -> Int8,
    }
}

diesel::table! {
    room_reports (report_id) {
        report_id -> Int8,
        received_ts -> Int8,
        room_id -> Text,
        user_id -> Text,
        reason -> Text,
    }
}

diesel::table! {
    rooms (room_id) {
        room_id -> Text,
        room_version -> Text,
        creator -> Text,
        is_public -> Bool,
        current_state_group -> Int8,
        created_ts -> Int8,
        forward_extremities -> Array<Text>,
        tip_depth -> Int8,
        redactions -> Int8,
        nid -> Int4,
    }
}

diesel::table! {
    remote_media (origin, media_id) {
        origin -> Text,
        media_id -> Text,
        content_type -> Nullable<Text>,
        filename -> Nullable<Text>,
        size -> Int8,
        sha256 -> Text,
        fetched_ts -> Int8,
    }
}

diesel::table! {
    remote_media_thumbnails (origin, media_id, width, height, method) {
        origin -> Text,
        media_id -> Text,
        width -> Int4,
        height -> Int4,
        method -> Text,
        content_type -> Text,
        sha256 -> Text,
        size -> Int8,
    }
}

diesel::table! {
    remote_server_keys (server_name, key_id) {
        server_name -> Text,
        key_id -> Text,
        public_key -> Text,
        valid_until_ts -> Int8,
        expired_ts -> Nullable<Int8>,
        fetched_ts -> Int8,
    }
}

diesel::table! {
    remote_device_lists (user_id) {
        user_id -> Text,
        stream_id -> Int8,
        stale -> Bool,
        master_key -> Nullable<Jsonb>,
        self_signing_key -> Nullable<Jsonb>,
        updated_ts -> Int8,
    }
}

diesel::table! {
    remote_devices (user_id, device_id) {
        user_id -> Text,
        device_id -> Text,
        keys -> Nullable<Jsonb>,
        display_name -> Nullable<Text>,
    }
}

diesel::table! {
    federation_destinations (destination) {
        destination -> Text,
        failures -> Int4,
        retry_at_ts -> Int8,
        txn_id -> Nullable<Text>,
        txn_body -> Nullable<Jsonb>,
    }
}

diesel::table! {
    appservice_states (appservice_id) {
        appservice_id -> Text,
        events_upto -> Int8,
        last_txn_id -> Int8,
        txn_id -> Nullable<Int8>,
        txn_body -> Nullable<Jsonb>,
        failures -> Int4,
        retry_at_ts -> Int8,
        to_device_upto -> Int8,
        device_lists_upto -> Int8,
    }
}

diesel::table! {
    federation_outbox (outbox_id) {
        outbox_id -> Int8,
        destination -> Text,
        edu_type -> Nullable<Text>,
        content -> Jsonb,
        txn_id -> Nullable<Text>,
        created_ts -> Int8,
        event_id -> Nullable<Text>,
    }
}

diesel::table! {
    federation_pdu_cursor (single) {
        single -> Bool,
        stream_ordering -> Int8,
    }
}

diesel::table! {
    federation_received_txns (origin, txn_id) {
        origin -> Text,
        txn_id -> Text,
        response -> Jsonb,
        received_ts -> Int8,
    }
}

diesel::table! {
    federation_received_to_device (origin, message_id) {
        origin -> Text,
        message_id -> Text,
        received_ts -> Int8,
    }
}

diesel::table! {
    server_signing_keys (key_id) {
        key_id -> Text,
        secret_der -> Bytea,
        created_ts -> Int8,
    }
}

diesel::table! {
    state_group_entries (state_group, event_type, state_key) {
        state_group -> Int8,
        event_type -> Text,
        state_key -> Text,
        event_id -> Text,
    }
}

diesel::table! {
    state_groups (state_group) {
        state_group -> Int8,
        room_id -> Text,
        parent_group -> Nullable<Int8>,
        chain_length -> Int4,
        prev_group -> Nullable<Int8>,
        delta_depth -> Int4,
        snapshot_rows -> Int4,
    }
}

diesel::table! {
    stream_positions (stream) {
        stream -> Text,
        stream_no -> Int4,
    }
}

diesel::table! {
    sliding_sync_connections (conn_key) {
        conn_key -> Int8,
        user_id -> Text,
        device_id -> Text,
        conn_id -> Text,
        base_version -> Int8,
        pending_versions -> Array<Int8>,
        last_used_ts -> Int8,
    }
}

diesel::table! {
    sliding_sync_rooms (conn_key, room_id, version) {
        conn_key -> Int8,
        room_id -> Text,
        version -> Int8,
        membership -> Text,
        events_from -> Nullable<Int8>,
        timeline_limit -> Int4,
        required_state -> Jsonb,
    }
}

diesel::table! {
    delayed_events (delay_id) {
        delay_id -> Text,
        user_id -> Text,
        device_id -> Nullable<Text>,
        room_id -> Text,
        event_type -> Text,
        state_key -> Nullable<Text>,
        content -> Jsonb,
        delay_ms -> Int8,
        send_ts -> Int8,
        status -> Text,
        claimed_ts -> Nullable<Int8>,
        event_id -> Nullable<Text>,
        error -> Nullable<Text>,
        created_ts -> Int8,
        finalised_ts -> Nullable<Int8>,
        txn_id -> Nullable<Text>,
    }
}

diesel::table! {
    dehydrated_devices (user_id) {
        user_id -> Text,
        device_id -> Text,
        device_data -> Jsonb,
        created_ts -> Int8,
    }
}

diesel::table! {
    user_membership_versions (user_id) {
        user_id -> Text,
        version -> Int8,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    access_tokens,
    admin_history_purges,
    admin_room_deletions,
    blocked_rooms,
    user_ratelimit_overrides,
    account_data,
    appservice_states,
    backup_keys,
    backup_versions,
    cross_signing_keys,
    dehydrated_devices,
    delayed_events,
    device_keys,
    device_list_changes,
    devices,
    event_push_actions,
    event_relations,
    event_reports,
    event_txns,
    events,
    fallback_keys,
    federation_destinations,
    federation_outbox,
    federation_pdu_cursor,
    federation_received_to_device,
    federation_received_txns,
    filters,
    key_signatures,
    media,
    media_thumbnails,
    one_time_keys,
    openid_tokens,
    presence,
    profile_fields,
    pushers,
    receipts,
    refresh_tokens,
    registration_tokens,
    remote_device_lists,
    remote_devices,
    remote_media,
    remote_media_thumbnails,
    remote_server_keys,
    room_aliases,
    room_current_state,
    room_member_counts,
    room_memberships,
    room_reports,
    rooms,
    server_signing_keys,
    sliding_sync_connections,
    sliding_sync_rooms,
    state_group_entries,
    state_groups,
    stream_positions,
    to_device_inbox,
    to_device_txns,
    uia_sessions,
    unread_count_summaries,
    user_membership_versions,
    user_reports,
    users,
);

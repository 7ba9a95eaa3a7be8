// @generated automatically by Diesel CLI (format of `diesel print-schema`; keep in step with migrations/).

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
    devices (user_id, device_id) {
        user_id -> Text,
        device_id -> Text,
        display_name -> Nullable<Text>,
        last_seen_ts -> Nullable<Int8>,
        last_seen_ip -> Nullable<Text>,
        created_ts -> Int8,
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
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    access_tokens,
    account_data,
    devices,
    filters,
    profile_fields,
    refresh_tokens,
    registration_tokens,
    uia_sessions,
    users,
);

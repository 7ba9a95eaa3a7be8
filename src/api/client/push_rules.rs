//! Push rules: read and edit the user's ruleset (`/pushrules/global/...`).

use actix_web::web::Data;
use ruma::{
    api::client::push::{
        delete_pushrule::v3 as delete_rule, get_pushrule::v3 as get_rule,
        get_pushrule_actions::v3 as get_actions, get_pushrule_enabled::v3 as get_enabled,
        get_pushrules_all::v3 as get_all, get_pushrules_global_scope::v3 as get_global,
        set_pushrule::v3 as set_rule, set_pushrule_actions::v3 as set_actions,
        set_pushrule_enabled::v3 as set_enabled,
    },
    push::{AnyPushRuleRef, RuleKind, Ruleset},
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{
        push_rules::{insert_error, remove_error},
        Services,
    },
};

fn find<'a>(rules: &'a Ruleset, kind: &RuleKind, rule_id: &str) -> Result<AnyPushRuleRef<'a>> {
    rules
        .get(kind.clone(), rule_id)
        .ok_or_else(|| Error::not_found("No such push rule"))
}

/// `GET /_matrix/client/v3/pushrules/`
pub async fn get_pushrules_all_route(
    services: Data<Services>,
    body: Ruma<get_all::Request>,
) -> Result<RumaResponse<get_all::Response>> {
    let caller = body.caller()?;
    let rules = services.push_rules.get(&caller.user_id).await?;
    Ok(get_all::Response::new(rules).into())
}

/// `GET /_matrix/client/v3/pushrules/global/`
pub async fn get_pushrules_global_route(
    services: Data<Services>,
    body: Ruma<get_global::Request>,
) -> Result<RumaResponse<get_global::Response>> {
    let caller = body.caller()?;
    let rules = services.push_rules.get(&caller.user_id).await?;
    Ok(get_global::Response::new(rules).into())
}

/// `GET /_matrix/client/v3/pushrules/global/{kind}/{ruleId}`
pub async fn get_pushrule_route(
    services: Data<Services>,
    body: Ruma<get_rule::Request>,
) -> Result<RumaResponse<get_rule::Response>> {
    let caller = body.caller()?;
    let rules = services.push_rules.get(&caller.user_id).await?;
    let rule = find(&rules, &body.body.kind, &body.body.rule_id)?;
    Ok(get_rule::Response::new(rule.into()).into())
}

/// `PUT /_matrix/client/v3/pushrules/global/{kind}/{ruleId}`
pub async fn set_pushrule_route(
    services: Data<Services>,
    body: Ruma<set_rule::Request>,
) -> Result<RumaResponse<set_rule::Response>> {
    let caller = body.caller()?;
    let request = body.body.clone();
    services
        .push_rules
        .update(&caller.user_id, |rules| {
            rules
                .insert(
                    request.rule,
                    request.after.as_deref(),
                    request.before.as_deref(),
                )
                .map_err(insert_error)
        })
        .await?;
    Ok(set_rule::Response::new().into())
}

/// `DELETE /_matrix/client/v3/pushrules/global/{kind}/{ruleId}`
pub async fn delete_pushrule_route(
    services: Data<Services>,
    body: Ruma<delete_rule::Request>,
) -> Result<RumaResponse<delete_rule::Response>> {
    let caller = body.caller()?;
    let (kind, rule_id) = (body.body.kind.clone(), body.body.rule_id.clone());
    services
        .push_rules
        .update(&caller.user_id, |rules| {
            rules.remove(kind, rule_id).map_err(remove_error)
        })
        .await?;
    Ok(delete_rule::Response::new().into())
}

/// `GET /_matrix/client/v3/pushrules/global/{kind}/{ruleId}/enabled`
pub async fn get_pushrule_enabled_route(
    services: Data<Services>,
    body: Ruma<get_enabled::Request>,
) -> Result<RumaResponse<get_enabled::Response>> {
    let caller = body.caller()?;
    let rules = services.push_rules.get(&caller.user_id).await?;
    let rule = find(&rules, &body.body.kind, &body.body.rule_id)?;
    Ok(get_enabled::Response::new(rule.enabled()).into())
}

/// `PUT /_matrix/client/v3/pushrules/global/{kind}/{ruleId}/enabled`
pub async fn set_pushrule_enabled_route(
    services: Data<Services>,
    body: Ruma<set_enabled::Request>,
) -> Result<RumaResponse<set_enabled::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let (kind, rule_id, enabled) = (
        request.kind.clone(),
        request.rule_id.clone(),
        request.enabled,
    );
    services
        .push_rules
        .update(&caller.user_id, |rules| {
            rules
                .set_enabled(kind, rule_id, enabled)
                .map_err(|_| Error::not_found("No such push rule"))
        })
        .await?;
    Ok(set_enabled::Response::new().into())
}

/// `GET /_matrix/client/v3/pushrules/global/{kind}/{ruleId}/actions`
pub async fn get_pushrule_actions_route(
    services: Data<Services>,
    body: Ruma<get_actions::Request>,
) -> Result<RumaResponse<get_actions::Response>> {
    let caller = body.caller()?;
    let rules = services.push_rules.get(&caller.user_id).await?;
    let rule = find(&rules, &body.body.kind, &body.body.rule_id)?;
    Ok(get_actions::Response::new(rule.actions().to_vec()).into())
}

/// `PUT /_matrix/client/v3/pushrules/global/{kind}/{ruleId}/actions`
pub async fn set_pushrule_actions_route(
    services: Data<Services>,
    body: Ruma<set_actions::Request>,
) -> Result<RumaResponse<set_actions::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let (kind, rule_id) = (request.kind.clone(), request.rule_id.clone());
    let actions = request.actions.clone();
    services
        .push_rules
        .update(&caller.user_id, |rules| {
            rules
                .set_actions(kind, rule_id, actions)
                .map_err(|_| Error::not_found("No such push rule"))
        })
        .await?;
    Ok(set_actions::Response::new().into())
}

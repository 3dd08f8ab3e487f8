//! Tokens: mint (operator, or one tenant's), list (never a secret), revoke.

use proto::api::TokenMinted;
use proto::front::{Reply, Request};
use serde::Deserialize;
use serde_json::json;

use super::{ask, tenant_id, unexpected};
use crate::http::{body, ok, Call, Front, HttpError, Out};

/// A mint takes no fields: an empty body or `{}`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MintBody {}

fn minted(t: &TokenMinted) -> serde_json::Value {
    json!({
        "id": t.id,
        "secret": t.secret,
        "tenant": t.tenant,
        "created_ms": t.created_ms,
    })
}

fn mint_for(front: &Front, call: &mut Call, tenant: Option<String>) -> Out {
    let parsed = call
        .only_query(&[])
        .and_then(|()| call.body())
        .and_then(|b| body::json_or_default::<MintBody>(&b));
    if let Err(e) = parsed {
        return e.into();
    }
    match ask(front, call, Request::MintToken { tenant }) {
        Ok(Reply::TokenMinted(t)) => ok(minted(&t)),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn mint(front: &Front, call: &mut Call) -> Out {
    mint_for(front, call, None)
}

pub fn mint_tenant(front: &Front, call: &mut Call) -> Out {
    match tenant_id(call, 0) {
        Ok(id) => mint_for(front, call, Some(id)),
        Err(e) => e.into(),
    }
}

pub fn list(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::ListTokens) {
        Ok(Reply::Tokens(ts)) => ok(json!({
            "tokens": ts.iter().map(|t| json!({
                "id": t.id,
                "tenant": t.tenant,
                "created_ms": t.created_ms,
                "revoked_ms": t.revoked_ms,
            })).collect::<Vec<_>>()
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// Token ids: `tok_` and hex.
fn token_id(s: &str) -> Result<String, HttpError> {
    let ok = s.strip_prefix("tok_").is_some_and(|h| {
        !h.is_empty() && h.len() <= 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if !ok {
        return Err(HttpError::bad_request(format!(
            "{:?} is not a token id (tok_ and hex digits, as GET /tokens lists them)",
            s.chars().take(80).collect::<String>()
        )));
    }
    Ok(s.to_string())
}

pub fn revoke(front: &Front, call: &mut Call) -> Out {
    let id = match call.only_query(&[]).and_then(|()| token_id(call.param(0))) {
        Ok(id) => id,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::RevokeToken { id }) {
        Ok(Reply::TokenRevoked { id }) => ok(json!({ "id": id, "revoked": true })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

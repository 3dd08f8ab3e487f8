//! `/tenants/{id}/secrets…`: set and delete a tenant's secret, list their names. No route
//! answers with a value, and no refusal repeats the body: a body that does not parse is
//! refused with a fixed message.

use proto::api::SecretValue;
use proto::front::{Reply, Request};
use serde::Deserialize;
use serde_json::json;

use super::{ask, tenant_id, unexpected};
use crate::http::{body, ok, Call, Front, HttpError, Out};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    value: String,
}

fn secret_name(call: &Call, i: usize) -> Result<String, HttpError> {
    let n = call.param(i);
    if !proto::api::is_secret_name(n) {
        return Err(HttpError::bad_request(
            "a secret name is 1 to 64 letters, digits and _, not starting with a digit",
        ));
    }
    Ok(n.to_string())
}

pub fn put(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let id = tenant_id(call, 0)?;
        let name = secret_name(call, 1)?;
        let raw = call.body()?;
        // Never the parser's message: it could quote the body.
        let b: PutBody = body::json(&raw).map_err(|_| {
            HttpError::bad_request(
                "the body must be a JSON object with one key, \"value\": the secret as a string",
            )
        })?;
        if b.value.len() > proto::api::MAX_SECRET_VALUE {
            return Err(HttpError::new(
                413,
                "too_large",
                format!(
                    "a secret's value is at most {} bytes",
                    proto::api::MAX_SECRET_VALUE
                ),
            ));
        }
        Ok((id, name, b.value))
    })();
    let (tenant, name, value) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let req = Request::PutSecret {
        tenant,
        name,
        value: SecretValue(value.into_bytes()),
    };
    match ask(front, call, req) {
        Ok(Reply::SecretStored {
            tenant,
            name,
            replaced,
        }) => ok(json!({"tenant": tenant, "name": name, "replaced": replaced})),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn delete(front: &Front, call: &mut Call) -> Out {
    let parsed = call
        .only_query(&[])
        .and_then(|()| Ok((tenant_id(call, 0)?, secret_name(call, 1)?)));
    let (tenant, name) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DeleteSecret { tenant, name }) {
        Ok(Reply::SecretDeleted { tenant, name }) => {
            ok(json!({"tenant": tenant, "name": name, "deleted": true}))
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn list(front: &Front, call: &mut Call) -> Out {
    let tenant = match call.only_query(&[]).and_then(|()| tenant_id(call, 0)) {
        Ok(t) => t,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::ListSecrets { tenant }) {
        Ok(Reply::Secrets { tenant, names }) => ok(json!({"tenant": tenant, "secrets": names})),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

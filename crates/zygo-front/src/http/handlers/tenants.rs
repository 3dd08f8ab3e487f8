//! `/tenants…`: create, list, read, delete, limits.

use proto::front::{Reply, Request};
use serde::Deserialize;
use serde_json::json;

use super::{ask, sha, tenant_id, tenant_json, unexpected};
use crate::http::{body, ok, Call, Front, HttpError, Out};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    id: String,
}

pub fn create(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let b: CreateBody = body::json(&call.body()?)?;
        if !proto::api::is_tenant_id(&b.id) {
            return Err(HttpError::bad_request(format!(
                "{:?} is not a tenant id (1-63 of a-z, 0-9, _ and -, starting with a letter or digit)",
                b.id.chars().take(80).collect::<String>()
            )));
        }
        Ok(b.id)
    })();
    let id = match parsed {
        Ok(id) => id,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::CreateTenant { id }) {
        Ok(Reply::Tenant { tenant, created }) => {
            ok(json!({ "tenant": tenant_json(&tenant), "created": created }))
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn list(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::ListTenants) {
        Ok(Reply::Tenants(ts)) => ok(json!({
            "tenants": ts.iter().map(tenant_json).collect::<Vec<_>>()
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn get(front: &Front, call: &mut Call) -> Out {
    let id = match call.only_query(&[]).and_then(|()| tenant_id(call, 0)) {
        Ok(id) => id,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::GetTenant { id }) {
        Ok(Reply::Tenant { tenant, .. }) => ok(tenant_json(&tenant)),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn delete(front: &Front, call: &mut Call) -> Out {
    let id = match call.only_query(&[]).and_then(|()| tenant_id(call, 0)) {
        Ok(id) => id,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DeleteTenant { id }) {
        Ok(Reply::TenantDeleted(d)) => ok(json!({
            "id": d.id,
            "stopped": d.stopped,
            "scripts_removed": d.scripts_removed.iter().map(|s| sha(s)).collect::<Vec<_>>(),
            "tokens_revoked": d.tokens_revoked,
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn limits(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| -> Result<_, HttpError> {
        call.only_query(&[])?;
        let id = tenant_id(call, 0)?;
        let limits = crate::http::bodies::limits::parse(&call.body()?)?;
        Ok((id, limits))
    })();
    let (id, limits) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::SetLimits { id, limits }) {
        Ok(Reply::Tenant { tenant, .. }) => ok(tenant_json(&tenant)),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

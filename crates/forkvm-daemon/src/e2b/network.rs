//! E2B's egress rules (`network: {allowOut, denyOut}` on create) mapped onto
//! forkvm's egress allow-list (`egress`, docs/networking.md).
//!
//! E2B lets out what `denyOut` does not name, and `allowOut` wins over
//! `denyOut`. forkvm keeps a list of what is allowed, everything else
//! refused. So the allow-list is the IPv4 space minus the `denyOut` blocks
//! (as the fewest CIDR blocks that cover the rest), plus the `allowOut`
//! entries; with no `denyOut` nothing is restricted and `allowOut` changes
//! nothing, as in E2B.
//!
//! What the allow-list cannot hold is refused with 400 rather than
//! dropped: domain names (forkvm filters addresses, not names), and
//! per-host request rules (`rules`) and egress proxies, which need E2B's
//! proxy. `allowPublicTraffic`, `maskRequestHost` and `httpsPorts` concern
//! E2B's public sandbox URLs, which forkvm does not have (every port is
//! reached through the token-checked listener), so they change nothing.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::Router;
use forkvm_api::EgressRule;
use serde_json::Value;

use crate::actions::Engine;

pub(crate) fn router() -> Router<Engine> {
    Router::new().route("/sandboxes/{id}/network", put(update))
}

/// `PUT /sandboxes/{id}/network` (`Sandbox.update_network`): the body is
/// mapped as a create's `network` is ([`egress`]), with what is omitted
/// cleared, as the SDK documents (`{}` lets everything out again), and
/// `allow_internet_access: false` taken as `denyOut: ["0.0.0.0/0"]`, as
/// E2B's API documents it; then the running sandbox's allow-list is
/// replaced in place ([`Engine::set_network`]). 204 as E2B answers.
async fn update(
    State(m): State<Engine>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    let egress = match update_egress(&bytes) {
        Ok(e) => e,
        Err(why) => return super::error(StatusCode::BAD_REQUEST, why),
    };
    let r = tokio::spawn(async move { m.set_network(&id, egress, None).await }).await;
    match r {
        Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => super::error(crate::api::error::status(&e), e.to_string()),
        Err(e) => super::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("network task failed: {e}"),
        ),
    }
}

/// The allow-list an `update_network` body asks for.
fn update_egress(bytes: &[u8]) -> Result<Option<Vec<EgressRule>>, String> {
    let mut v: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(bytes).map_err(|e| format!("the body is not JSON: {e}"))?
    };
    let Value::Object(o) = &mut v else {
        return Err("the body must be an object".into());
    };
    match o.remove("allow_internet_access") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            let mut deny = strings(o.get("denyOut"), "denyOut")?;
            deny.push("0.0.0.0/0".into());
            o.insert("denyOut".into(), deny.into());
        }
        Some(_) => return Err("allow_internet_access must be true or false".into()),
    }
    egress(&v)
}

/// An IPv4 block: a network address and its prefix length.
type Block = (u32, u8);

fn parse_block(s: &str) -> Result<Block, String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (
            a,
            l.parse::<u8>()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?,
        ),
        None => (s, 32),
    };
    let ip: std::net::Ipv4Addr = addr.parse().map_err(|_| {
        if addr.bytes().any(|b| b.is_ascii_alphabetic()) || addr.contains('*') {
            format!(
                "{s:?} is a domain name: forkvm's egress allow-list holds IPv4 addresses and \
                 networks only (docs/e2b.md)"
            )
        } else {
            format!("{s:?} is not an IPv4 address or network (A.B.C.D or A.B.C.D/N)")
        }
    })?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok((u32::from(ip) & mask, len))
}

fn contains(outer: Block, inner: Block) -> bool {
    let mask = if outer.1 == 0 {
        0
    } else {
        u32::MAX << (32 - outer.1)
    };
    outer.1 <= inner.1 && inner.0 & mask == outer.0
}

/// `from` minus `hole`, as blocks.
fn subtract(from: Block, hole: Block) -> Vec<Block> {
    if contains(hole, from) {
        return vec![];
    }
    if !contains(from, hole) {
        return vec![from];
    }
    // Split `from` in halves until `hole` is one of them.
    let mut out = Vec::new();
    let mut cur = from;
    while cur.1 < hole.1 {
        let len = cur.1 + 1;
        let bit = 1u32 << (32 - len);
        let (lo, hi) = ((cur.0, len), (cur.0 | bit, len));
        if contains(lo, hole) {
            out.push(hi);
            cur = lo;
        } else {
            out.push(lo);
            cur = hi;
        }
    }
    out
}

fn strings(v: Option<&Value>, field: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("network.{field} must be a list of strings"))
            })
            .collect(),
        Some(_) => Err(format!("network.{field} must be a list of strings")),
    }
}

fn render((addr, len): Block) -> String {
    format!("{}/{len}", std::net::Ipv4Addr::from(addr))
}

/// The allow-list for an E2B `network` body: `None` when nothing is
/// restricted, or a refusal saying what forkvm cannot enforce.
pub(crate) fn egress(net: &Value) -> Result<Option<Vec<EgressRule>>, String> {
    let Value::Object(o) = net else {
        return Err("network must be an object".into());
    };
    for (k, why) in [
        ("rules", "per-host request rules need E2B's egress proxy"),
        ("egressProxy", "forkvm has no egress proxy"),
    ] {
        if o.get(k)
            .is_some_and(|v| !v.is_null() && v != &Value::Object(Default::default()))
        {
            return Err(format!("network.{k} is not supported: {why} (docs/e2b.md)"));
        }
    }
    let allow = strings(o.get("allowOut"), "allowOut")?
        .iter()
        .map(|s| parse_block(s))
        .collect::<Result<Vec<_>, _>>()?;
    let deny = strings(o.get("denyOut"), "denyOut")?
        .iter()
        .map(|s| parse_block(s))
        .collect::<Result<Vec<_>, _>>()?;
    if deny.is_empty() {
        return Ok(None);
    }
    let mut open: Vec<Block> = vec![(0, 0)];
    for hole in &deny {
        open = open.into_iter().flat_map(|b| subtract(b, *hole)).collect();
    }
    open.extend(allow);
    // An allowed block inside another adds nothing.
    let mut kept: Vec<Block> = Vec::new();
    for b in &open {
        if !open.iter().any(|o| o != b && contains(*o, *b)) && !kept.contains(b) {
            kept.push(*b);
        }
    }
    kept.sort();
    Ok(Some(
        kept.into_iter()
            .map(|b| EgressRule {
                cidr: render(b),
                ports: vec![],
            })
            .collect(),
    ))
}

/// [`egress`] of a create's optional `network` field.
pub(crate) fn egress_of(net: Option<&Value>) -> Result<Option<Vec<EgressRule>>, String> {
    match net {
        None | Some(Value::Null) => Ok(None),
        Some(n) => egress(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cidrs(v: Value) -> Option<Vec<String>> {
        egress(&v)
            .unwrap()
            .map(|r| r.into_iter().map(|e| e.cidr).collect())
    }

    #[test]
    fn deny_all_with_allows_is_the_allows() {
        assert_eq!(
            cidrs(json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1", "10.0.0.0/8"]})),
            Some(vec!["1.1.1.1/32".into(), "10.0.0.0/8".into()])
        );
        assert_eq!(cidrs(json!({"denyOut": ["0.0.0.0/0"]})), Some(vec![]));
    }

    #[test]
    fn no_deny_restricts_nothing() {
        assert_eq!(cidrs(json!({})), None);
        assert_eq!(cidrs(json!({"allowOut": ["1.1.1.1"]})), None);
        assert_eq!(cidrs(json!({"allowPublicTraffic": false})), None);
    }

    #[test]
    fn denying_one_address_allows_the_rest_of_the_space() {
        let v = cidrs(json!({"denyOut": ["8.8.8.8"]})).unwrap();
        assert_eq!(v.len(), 32);
        let blocks: Vec<Block> = v.iter().map(|s| parse_block(s).unwrap()).collect();
        let hole = parse_block("8.8.8.8").unwrap();
        assert!(blocks.iter().all(|b| !contains(*b, hole)));
        // The blocks cover everything else exactly once: sizes sum to 2^32 - 1.
        let total: u64 = blocks.iter().map(|b| 1u64 << (32 - b.1)).sum();
        assert_eq!(total, (1u64 << 32) - 1);
        // allowOut wins over denyOut.
        let v = cidrs(json!({"denyOut": ["8.8.8.0/24"], "allowOut": ["8.8.8.8"]})).unwrap();
        assert!(v.contains(&"8.8.8.8/32".to_string()));
    }

    #[test]
    fn what_cannot_be_enforced_is_refused() {
        for bad in [
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com"]}),
            json!({"denyOut": ["*.example.com"]}),
            json!({"denyOut": ["10.0.0.0/33"]}),
            json!({"rules": {"example.com": [{"transform": {}}]}}),
            json!({"allowOut": "1.1.1.1"}),
        ] {
            assert!(egress(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_update_maps_as_a_create_and_omitted_fields_clear() {
        let up = |b: &str| {
            update_egress(b.as_bytes())
                .map(|r| r.map(|v| v.into_iter().map(|e| e.cidr).collect::<Vec<_>>()))
        };
        assert_eq!(up("{}").unwrap(), None);
        assert_eq!(up("").unwrap(), None);
        assert_eq!(
            up(r#"{"denyOut":["0.0.0.0/0"],"allowOut":["192.0.2.1"]}"#).unwrap(),
            Some(vec!["192.0.2.1/32".to_string()])
        );
        assert_eq!(
            up(r#"{"allow_internet_access":false,"allowOut":["192.0.2.1"]}"#).unwrap(),
            Some(vec!["192.0.2.1/32".to_string()])
        );
        assert_eq!(up(r#"{"allow_internet_access":true}"#).unwrap(), None);
        assert!(up(r#"{"denyOut":["0.0.0.0/0"],"allowOut":["example.com"]}"#).is_err());
        assert!(up(r#"{"egressProxy":{"address":"192.0.2.1:1080"}}"#).is_err());
        assert!(up("[]").is_err());
    }
}

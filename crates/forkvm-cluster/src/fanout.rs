//! Operations that ask every node: lists, metrics, events, `info`, and
//! writes sent to several nodes.
//!
//! * Lists (`sandboxes`, `snapshots`, `images`, `volumes`) are concatenated;
//!   a snapshot or image held by several nodes is listed once (the copy on
//!   the node its id names first). Sandboxes lost with a dead node are added
//!   with state `lost`.
//! * Metrics (Prometheus text) are merged family by family, each sample
//!   labelled with its `node`, so the result is one valid exposition.
//! * Events (Server-Sent Events) from every node are interleaved as they
//!   come; each event's `id` becomes `NODE:ID`. Replay from `Last-Event-ID`
//!   is per node and is not offered through the gateway.

use std::collections::BTreeSet;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use forkvm_api::routes::Op;
use forkvm_api::{Capacity, Info, Sandbox};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::nodes::Node;
use crate::proxy::{error, Auth};
use crate::server::no_node;
use crate::state::{unreachable, Gateway};

/// Largest list body read from one node.
const MAX_LIST: usize = 64 << 20;

/// `GET /v1/info` for the cluster: the first live node's, with counts and
/// capacity summed over live nodes and every node's images.
pub async fn info(gw: &Gateway) -> Response<Body> {
    let alive = gw.nodes.alive();
    let Some(first) = alive.iter().find_map(|n| n.info.clone()) else {
        return no_node();
    };
    let mut out: Info = first;
    out.home = format!("cluster of {} live node(s)", alive.len());
    let mut images = BTreeSet::new();
    let mut cap = Capacity::default();
    let (mut sandboxes, mut snapshots, mut max) = (0u32, 0u32, 0u32);
    for i in alive.iter().filter_map(|n| n.info.as_ref()) {
        images.extend(i.images.iter().cloned());
        sandboxes += i.sandboxes;
        snapshots += i.snapshots;
        max = max.saturating_add(i.limits.max_sandboxes);
        let c = &i.capacity;
        cap.memory_commit_mib += c.memory_commit_mib;
        cap.memory_used_mib += c.memory_used_mib;
        cap.memory_reserved_mib += c.memory_reserved_mib;
        cap.memory_left_mib += c.memory_left_mib;
        cap.counted_sandboxes += c.counted_sandboxes;
        cap.disk_free_mib += c.disk_free_mib;
        cap.disk_reserve_mib += c.disk_reserve_mib;
    }
    out.images = images.into_iter().collect();
    out.sandboxes = sandboxes;
    out.snapshots = snapshots;
    out.limits.max_sandboxes = max;
    out.capacity = cap;
    axum::Json(out).into_response()
}

/// A list, metrics or events from every live node.
pub async fn merge(gw: &Gateway, op: Op, req: Request) -> Response<Body> {
    let alive = gw.nodes.alive();
    if op == Op::Events {
        return events(gw, &alive, req).await;
    }
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let mut bodies = Vec::new();
    let mut ctype = None;
    for n in &alive {
        let r = Request::get(&pq).body(Body::empty()).unwrap();
        match gw
            .http
            .forward(&n.addr, r, None, Auth::Bearer(&gw.cfg.cluster_token))
            .await
        {
            Ok(resp) if resp.status().is_success() => {
                if ctype.is_none() {
                    ctype = resp.headers().get(header::CONTENT_TYPE).cloned();
                }
                match resp.into_body().collect().await.map(|b| b.to_bytes()) {
                    Ok(b) if b.len() <= MAX_LIST => bodies.push((n.entry.name.clone(), b)),
                    _ => return unreachable(n),
                }
            }
            // A node's refusal (bad query) is the answer.
            Ok(resp) => return resp,
            Err(e) => {
                let mut n = n.clone();
                n.error = Some(e);
                return unreachable(&n);
            }
        }
    }
    if op == Op::Metrics {
        let texts: Vec<(String, String)> = bodies
            .into_iter()
            .map(|(n, b)| (n, String::from_utf8_lossy(&b).into_owned()))
            .collect();
        let mut r = merge_metrics(&texts).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            ctype.unwrap_or(HeaderValue::from_static(
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )),
        );
        return r;
    }
    let (field, key) = match op {
        Op::ListSandboxes => ("sandboxes", "id"),
        Op::ListSnapshots => ("snapshots", "id"),
        Op::ListImages => ("images", "name"),
        _ => ("volumes", "name"),
    };
    let mut lists = Vec::new();
    for (name, b) in &bodies {
        match serde_json::from_slice::<Value>(b) {
            Ok(v) => lists.push(v),
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    forkvm_api::codes::INTERNAL,
                    format!("node {name} answered a list that does not parse: {e}"),
                )
            }
        }
    }
    let extra = if op == Op::ListSandboxes {
        lost_matching(gw, &pq)
    } else {
        Vec::new()
    };
    axum::Json(merge_lists(lists, field, key, extra)).into_response()
}

/// The lost sandboxes a list query asks for (its `metadata.K=V` filters).
fn lost_matching(gw: &Gateway, pq: &str) -> Vec<Value> {
    let filters: Vec<(String, String)> = pq
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| {
            let k = k.strip_prefix(forkvm_api::METADATA_QUERY_PREFIX)?;
            Some((decode(k), decode(v)))
        })
        .collect();
    gw.lost
        .all()
        .into_iter()
        .filter(|s: &Sandbox| {
            filters
                .iter()
                .all(|(k, v)| s.metadata.get(k).is_some_and(|x| x == v))
        })
        .filter_map(|s| serde_json::to_value(s).ok())
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(())
                {
                    Ok(x) => {
                        out.push(x);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Concatenate the `field` arrays of `lists` (objects), keeping the first
/// item of each `key`, then `extra`.
pub fn merge_lists(lists: Vec<Value>, field: &str, key: &str, extra: Vec<Value>) -> Value {
    let mut seen = BTreeSet::new();
    let mut items = Vec::new();
    let mut out = serde_json::Map::new();
    for v in lists {
        if let Value::Object(mut o) = v {
            if let Some(Value::Array(a)) = o.remove(field) {
                for it in a {
                    let k = it.get(key).map(|k| k.to_string());
                    if k.as_ref().is_none_or(|k| seen.insert(k.clone())) {
                        items.push(it);
                    }
                }
            }
            for (k, v) in o {
                out.entry(k).or_insert(v);
            }
        }
    }
    for it in extra {
        let k = it.get(key).map(|k| k.to_string());
        if k.as_ref().is_none_or(|k| seen.insert(k.clone())) {
            items.push(it);
        }
    }
    out.insert(field.to_string(), Value::Array(items));
    Value::Object(out)
}

/// Merge Prometheus text expositions, one per node: each family once (its
/// HELP and TYPE from the first node that has it), its samples from every
/// node with a `node` label added.
pub fn merge_metrics(texts: &[(String, String)]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut fams: std::collections::HashMap<String, Family> = Default::default();
    for (node, text) in texts {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split_whitespace().next().unwrap_or("").to_string();
                let f = family(&mut fams, &mut order, &name);
                f.help.get_or_insert_with(|| line.to_string());
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split_whitespace().next().unwrap_or("").to_string();
                let f = family(&mut fams, &mut order, &name);
                f.kind.get_or_insert_with(|| line.to_string());
                current = name;
            } else if line.starts_with('#') || line.trim().is_empty() {
                continue;
            } else {
                let name_end = line.find(['{', ' ']).unwrap_or(line.len());
                let name = &line[..name_end];
                let fam = if !current.is_empty() && name.starts_with(current.as_str()) {
                    current.clone()
                } else {
                    name.to_string()
                };
                let labelled = if line[name_end..].starts_with('{') {
                    let inner = &line[name_end + 1..];
                    if inner.starts_with('}') {
                        format!("{name}{{node=\"{node}\"{inner}")
                    } else {
                        format!("{name}{{node=\"{node}\",{inner}")
                    }
                } else {
                    format!("{name}{{node=\"{node}\"}}{}", &line[name_end..])
                };
                family(&mut fams, &mut order, &fam).samples.push(labelled);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let f = &fams[&name];
        for l in f.help.iter().chain(f.kind.iter()).chain(f.samples.iter()) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

#[derive(Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

fn family<'a>(
    fams: &'a mut std::collections::HashMap<String, Family>,
    order: &mut Vec<String>,
    name: &str,
) -> &'a mut Family {
    if !fams.contains_key(name) {
        order.push(name.to_string());
    }
    fams.entry(name.to_string()).or_default()
}

/// Send `req` to each of `nodes`; the answer is the first failure, or the
/// first success. Bodies are read once and sent to each.
pub async fn to_each(gw: &Gateway, nodes: &[Node], req: Request) -> Response<Body> {
    to_each_with(gw, nodes, req, Auth::Bearer(&gw.cfg.cluster_token)).await
}

/// [`to_each`] with the credential to present.
pub async fn to_each_with(
    gw: &Gateway,
    nodes: &[Node],
    req: Request,
    auth: Auth<'_>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body: Bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                forkvm_api::codes::INVALID_REQUEST,
                format!("the request body could not be read: {e}"),
            )
        }
    };
    let sends = nodes.iter().map(|n| {
        let mut r = Request::new(Body::from(body.clone()));
        *r.method_mut() = parts.method.clone();
        *r.uri_mut() = parts.uri.clone();
        *r.headers_mut() = parts.headers.clone();
        let addr = n.addr.clone();
        async move { (n, gw.http.forward(&addr, r, None, auth).await) }
    });
    let mut first_ok = None;
    for (n, r) in futures_util::future::join_all(sends).await {
        match r {
            Ok(resp) if resp.status().is_success() => {
                first_ok.get_or_insert(resp);
            }
            Ok(resp) => return resp,
            Err(e) => {
                let mut n = n.clone();
                n.error = Some(e);
                return unreachable(&n);
            }
        }
    }
    first_ok.unwrap_or_else(no_node)
}

/// Interleave every live node's event stream.
async fn events(gw: &Gateway, alive: &[Node], req: Request) -> Response<Body> {
    if alive.is_empty() {
        return no_node();
    }
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    // Each node opens its stream with `ready`; the merged stream says it
    // once, when every node's stream is open, so a client that waits for it
    // misses no node's events.
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(alive.len());
    let mut streams = Vec::new();
    for n in alive {
        let r = Request::get(&pq).body(Body::empty()).unwrap();
        match gw
            .http
            .forward(&n.addr, r, None, Auth::Bearer(&gw.cfg.cluster_token))
            .await
        {
            Ok(r) if r.status().is_success() => streams.push((n.entry.name.clone(), r)),
            Ok(r) => return r,
            Err(e) => {
                let mut n = n.clone();
                n.error = Some(e);
                return unreachable(&n);
            }
        }
    }
    let total = streams.len();
    let gate = tx.clone();
    tokio::spawn(async move {
        let mut seen = 0;
        while seen < total && ready_rx.recv().await.is_some() {
            seen += 1;
        }
        let _ = gate
            .send(Ok(Bytes::from_static(
                b"event: ready\ndata: {\"seq\":0}\n\n",
            )))
            .await;
    });
    for (node, resp) in streams {
        let tx = tx.clone();
        let ready_tx = ready_tx.clone();
        tokio::spawn(async move {
            let mut body = resp.into_body();
            let mut buf = String::new();
            let mut opened = false;
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buf.push_str(&String::from_utf8_lossy(&data));
                while let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    if !opened && event.lines().any(|l| l.trim() == "event: ready") {
                        opened = true;
                        let _ = ready_tx.send(()).await;
                        continue;
                    }
                    if tx
                        .send(Ok(Bytes::from(relabel(&event, &node))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
    }
    drop(tx);
    let stream = tokio_stream_from(rx);
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// An SSE event with its `id:` made `NODE:ID`.
pub fn relabel(event: &str, node: &str) -> String {
    event
        .split_inclusive('\n')
        .map(|l| match l.strip_prefix("id:") {
            Some(rest) => format!("id: {node}:{}\n", rest.trim()),
            None => l.to_string(),
        })
        .collect()
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_concatenate_and_dedupe() {
        let a = json!({"snapshots": [{"id": "sn-n1-01"}, {"id": "sn-n1-02"}]});
        let b = json!({"snapshots": [{"id": "sn-n1-02", "copy": true}, {"id": "sn-n2-01"}]});
        let m = merge_lists(
            vec![a, b],
            "snapshots",
            "id",
            vec![json!({"id": "sn-n3-09"})],
        );
        let ids: Vec<&str> = m["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["sn-n1-01", "sn-n1-02", "sn-n2-01", "sn-n3-09"]);
        assert!(m["snapshots"][1].get("copy").is_none(), "first copy kept");
    }

    #[test]
    fn metrics_merge_into_one_valid_exposition() {
        let n1 = "# HELP forkvm_sandboxes Sandboxes.\n# TYPE forkvm_sandboxes gauge\nforkvm_sandboxes{state=\"running\"} 2\n# HELP forkvm_up Up.\n# TYPE forkvm_up gauge\nforkvm_up 1\n# EOF\n";
        let n2 = "# HELP forkvm_sandboxes Sandboxes.\n# TYPE forkvm_sandboxes gauge\nforkvm_sandboxes{state=\"running\"} 5\n# EOF\n";
        let m = merge_metrics(&[("n1".into(), n1.into()), ("n2".into(), n2.into())]);
        assert_eq!(
            m,
            "# HELP forkvm_sandboxes Sandboxes.\n# TYPE forkvm_sandboxes gauge\n\
             forkvm_sandboxes{node=\"n1\",state=\"running\"} 2\n\
             forkvm_sandboxes{node=\"n2\",state=\"running\"} 5\n\
             # HELP forkvm_up Up.\n# TYPE forkvm_up gauge\nforkvm_up{node=\"n1\"} 1\n# EOF\n"
        );
    }

    #[test]
    fn event_ids_carry_their_node() {
        assert_eq!(
            relabel("id: 7\nevent: sandbox\ndata: {}\n\n", "n2"),
            "id: n2:7\nevent: sandbox\ndata: {}\n\n"
        );
        assert_eq!(relabel(": ping\n\n", "n2"), ": ping\n\n");
    }

    #[test]
    fn query_values_decode() {
        assert_eq!(decode("a%20b+c"), "a b c");
        assert_eq!(decode("100%"), "100%");
    }
}

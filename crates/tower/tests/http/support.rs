//! A real server on loopback and a real HTTP client, bounded in time.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Every network step of a test finishes within this, or the test fails.
pub const BOUND: Duration = Duration::from_secs(10);

/// Serves `app` on 127.0.0.1:0 without the peer address (plain `into_make_service`).
pub async fn serve_without_peer(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service())
            .await
            .unwrap();
    });
    addr
}

/// A client whose connections leave from `local` (any 127.0.0.0/8 address on
/// loopback): one more client address, as the server's peer address sees it.
pub fn client_from(local: std::net::IpAddr) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The process's Prometheus recorder (a recorder is installed once per process; the
/// tests that scrape share it, each under its own limiter name).
pub fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .unwrap()
        })
        .clone()
}

/// Serves `app` on 127.0.0.1:0 with the peer address in the extensions.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response as the test reads it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// Sends `method path` with `headers` and reads the whole response.
pub async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::new()).unwrap();
    tokio::time::timeout(BOUND, async {
        let res = client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    })
    .await
    .expect("the request finished within the bound")
}

pub async fn get(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    send(client, addr, "GET", path, headers).await
}

/// Polls `cond` until it holds, failing the test after the bound (no timing assertion:
/// only a guard against hanging).
pub async fn eventually(mut cond: impl FnMut() -> bool) {
    tokio::time::timeout(BOUND, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the condition came true within the bound");
}

/// An sfv List field: items as (name, [(param, integer)]).
pub fn list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::parse_list(value.as_bytes()).expect("a structured-field List");
    list.into_iter()
        .map(|e| match e {
            ListEntry::Item(item) => {
                let name = match item.bare_item {
                    BareItem::String(s) => s,
                    other => panic!("the item's value is an sf-string, got {other:?}"),
                };
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.clone(), *i),
                        other => panic!("parameter {k:?} is an integer, got {other:?}"),
                    })
                    .collect();
                (name, params)
            }
            ListEntry::InnerList(_) => panic!("an item, not an inner list"),
        })
        .collect()
}

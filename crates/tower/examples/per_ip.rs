//! The one-line setup: 10 requests per second per client IP, bursts of 20.
//!
//! ```text
//! cargo run -p tokengate-tower --example per_ip        # listens on 127.0.0.1:3000
//! for i in $(seq 25); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! curl -I localhost:3000/        # HEAD pays the GET route
//! curl -i localhost:3000/nope    # 404s pay too
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use tokengate::Policy;
use tokengate_tower::RateLimitLayer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = RateLimitLayer::per_ip(Policy::new(20, 10.0)?)?;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

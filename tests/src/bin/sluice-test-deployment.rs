//! A deployment written with the real Restate Rust SDK, for black-box tests.
//!
//! `sluice-test-deployment <addr:port> [flavor]` serves over HTTP/2. Flavors change the manifest
//! the way an operator's redeploy would:
//! - `v1` (default): Greeter (service), Counter (virtual object), Signup (workflow);
//! - `v2`: Greeter gains a `farewell` handler;
//! - `fewer`: Greeter loses its `fail` handler;
//! - `object`: Greeter becomes a virtual object.

use std::time::Duration;

use restate_sdk::prelude::*;

struct Greeter;

#[service]
impl Greeter {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }

    /// Sleeps durably for `millis`, then answers them.
    #[handler]
    async fn slow(&self, ctx: Context<'_>, millis: u64) -> Result<u64, HandlerError> {
        ctx.sleep(Duration::from_millis(millis)).await?;
        Ok(millis)
    }

    /// Fails terminally with the given message.
    #[handler]
    async fn fail(&self, _ctx: Context<'_>, message: String) -> Result<(), HandlerError> {
        Err(TerminalError::new(message).into())
    }

    /// Runs a side effect once and journals its result.
    #[handler]
    async fn stamp(&self, ctx: Context<'_>) -> Result<String, HandlerError> {
        let stamp = ctx
            .run(|| async { Ok(format!("{:?}", std::time::SystemTime::now())) })
            .await?;
        Ok(stamp)
    }

    /// Calls `Counter/<key>/add` and answers its result.
    #[handler(name = "addVia")]
    async fn add_via(&self, ctx: Context<'_>, key: String) -> Result<u64, HandlerError> {
        Ok(ctx
            .object_client::<CounterClient>(key)
            .add(1)
            .call()
            .await?)
    }
}

struct GreeterV2;

#[service(name = "Greeter")]
impl GreeterV2 {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello again, {name}!"))
    }

    #[handler]
    async fn slow(&self, _ctx: Context<'_>, millis: u64) -> Result<u64, HandlerError> {
        Ok(millis)
    }

    #[handler]
    async fn fail(&self, _ctx: Context<'_>, message: String) -> Result<(), HandlerError> {
        Err(TerminalError::new(message).into())
    }

    #[handler]
    async fn stamp(&self, _ctx: Context<'_>) -> Result<String, HandlerError> {
        Ok("v2".to_owned())
    }

    #[handler(name = "addVia")]
    async fn add_via(&self, _ctx: Context<'_>, _key: String) -> Result<u64, HandlerError> {
        Ok(0)
    }

    #[handler]
    async fn farewell(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Bye, {name}!"))
    }
}

struct GreeterFewer;

#[service(name = "Greeter")]
impl GreeterFewer {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }
}

struct GreeterObject;

#[object(name = "Greeter")]
impl GreeterObject {
    #[handler]
    async fn greet(&self, _ctx: ObjectContext<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }
}

struct Counter;

#[object]
impl Counter {
    #[handler]
    async fn add(&self, ctx: ObjectContext<'_>, by: u64) -> Result<u64, HandlerError> {
        let next = ctx.get::<u64>("count").await?.unwrap_or(0) + by;
        ctx.set("count", next);
        Ok(next)
    }

    #[handler]
    async fn get(&self, ctx: SharedObjectContext<'_>) -> Result<u64, HandlerError> {
        Ok(ctx.get::<u64>("count").await?.unwrap_or(0))
    }
}

struct Signup;

#[workflow]
impl Signup {
    #[handler]
    async fn run(&self, ctx: WorkflowContext<'_>, email: String) -> Result<String, HandlerError> {
        ctx.set("status", "done".to_owned());
        Ok(format!("signed up {email}"))
    }

    #[handler]
    async fn status(&self, ctx: SharedWorkflowContext<'_>) -> Result<String, HandlerError> {
        Ok(ctx.get::<String>("status").await?.unwrap_or_default())
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .expect("usage: sluice-test-deployment <addr:port> [v1|v2|fewer|object]")
        .parse()
        .expect("an addr:port");
    let flavor = args.next().unwrap_or_else(|| "v1".to_owned());
    let builder = Endpoint::builder();
    let endpoint = match flavor.as_str() {
        "v1" => builder.bind(Greeter).bind(Counter).bind(Signup),
        "v2" => builder.bind(GreeterV2).bind(Counter).bind(Signup),
        "fewer" => builder.bind(GreeterFewer).bind(Counter).bind(Signup),
        "object" => builder.bind(GreeterObject),
        other => panic!("unknown flavor {other}"),
    };
    HttpServer::new(endpoint.build())
        .listen_and_serve(addr)
        .await;
}

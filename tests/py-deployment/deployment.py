"""A deployment written with the Restate Python SDK, for Sluice's black-box tests.

Usage: python deployment.py <port>  (HTTP/2 with prior knowledge, served by hypercorn)
"""

import asyncio
import sys
from datetime import timedelta

import restate
from hypercorn.asyncio import serve
from hypercorn.config import Config

# How many `PyMeter/hold` run at once in this process, and the most seen.
holding = 0
most_holding = 0
# Side effects of `PyMeter/runOnce`, counted inside `ctx.run` (a replay must not repeat them).
effects = 0
# The newest awakeable `awaitAwakeable` waits on.
last_awakeable = ""

meter = restate.Service("PyMeter")


@meter.handler()
async def hold(ctx: restate.Context, millis: int) -> int:
    """Holds for `millis` (not durably: the slot stays taken), counting how many hold at once."""
    global holding, most_holding
    holding += 1
    most_holding = max(most_holding, holding)
    try:
        await asyncio.sleep(millis / 1000)
    finally:
        holding -= 1
    return millis


@meter.handler()
async def peak(ctx: restate.Context) -> int:
    global most_holding
    seen, most_holding = most_holding, 0
    return seen


@meter.handler()
async def whoami(ctx: restate.Context) -> dict:
    """The scope and limit key this invocation started with (V7 StartMessage)."""
    request = ctx.request()
    return {"scope": request.scope, "limitKey": request.limit_key}


@meter.handler(name="fanOut")
async def fan_out(ctx: restate.Context, req: dict) -> int:
    """Calls `hold(millis)` `calls` times at once in `scope` under `limitKey`."""
    scoped = ctx.scope(req["scope"])
    calls = [
        scoped.service_call(hold, req["millis"], limit_key=req.get("limitKey"))
        for _ in range(req["calls"])
    ]
    for call in calls:
        await call
    return req["calls"]


@meter.handler(name="sendHolds")
async def send_holds(ctx: restate.Context, req: dict) -> int:
    """Sends `hold(millis)` `sends` times in `scope` under `limitKey`."""
    scoped = ctx.scope(req["scope"])
    for _ in range(req["sends"]):
        scoped.service_send(hold, req["millis"], limit_key=req.get("limitKey"))
    return req["sends"]


@meter.handler(name="askWho")
async def ask_who(ctx: restate.Context, req: dict) -> dict:
    """Asks `whoami` in `scope` under `limitKey`."""
    return await ctx.scope(req["scope"]).service_call(
        whoami, None, limit_key=req.get("limitKey")
    )


@meter.handler(name="runOnce")
async def run_once(ctx: restate.Context, millis: int) -> dict:
    """One side effect in `ctx.run`, then a durable sleep of `millis`: the effect is journaled
    before the sleep, so the attempt that resumes after it replays, never repeats, it."""

    async def effect() -> int:
        global effects
        effects += 1
        return effects

    seen = await ctx.run_typed("effect", effect)
    await ctx.sleep(timedelta(milliseconds=millis))
    return {"seen": seen, "effects": effects}


@meter.handler(name="spend")
async def spend(ctx: restate.Context, amount: int) -> int:
    """Reports `amount` as what it spent (`ctx.run_typed` steps named `sluice:cost`), in two
    steps around a durable sleep, and answers it."""
    first = amount // 2

    async def first_part() -> int:
        return first

    async def rest() -> int:
        return amount - first

    await ctx.run_typed("sluice:cost", first_part)
    await ctx.sleep(timedelta(milliseconds=20))
    await ctx.run_typed("sluice:cost", rest)
    return amount


@meter.handler(name="awaitAwakeable")
async def await_awakeable(ctx: restate.Context) -> str:
    global last_awakeable
    name, promise = ctx.awakeable(type_hint=str)
    last_awakeable = name
    return await promise


@meter.handler(name="lastAwakeable")
async def get_last_awakeable(ctx: restate.Context) -> str:
    return last_awakeable


counter = restate.VirtualObject("PyCounter")


@counter.handler()
async def add(ctx: restate.ObjectContext, by: int) -> int:
    total = (await ctx.get("count", type_hint=int) or 0) + by
    ctx.set("count", total)
    return total


@counter.handler(kind="shared")
async def get(ctx: restate.ObjectSharedContext) -> int:
    return await ctx.get("count", type_hint=int) or 0


signup = restate.Workflow("PySignup")


@signup.main()
async def run(ctx: restate.WorkflowContext, email: str) -> str:
    """Waits for `confirm` to resolve the `code` promise, then answers with it."""
    code = await ctx.promise("code", type_hint=str).value()
    return f"{email} confirmed with {code}"


@signup.handler()
async def confirm(ctx: restate.WorkflowSharedContext, code: str) -> str:
    await ctx.promise("code", type_hint=str).resolve(code)
    return "ok"


app = restate.app(services=[meter, counter, signup])


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: python deployment.py <port>", file=sys.stderr)
        sys.exit(2)
    config = Config()
    config.bind = [f"127.0.0.1:{sys.argv[1]}"]
    config.h2_max_concurrent_streams = 1000
    asyncio.run(serve(app, config))


if __name__ == "__main__":
    main()

// A deployment written with the Restate TypeScript SDK, for Sluice's black-box tests.
// Usage: node deployment.js <port> <h2|h1>
//   h2: HTTP/2 with prior knowledge, bidirectional streaming (BIDI_STREAM)
//   h1: HTTP/1.1, request/response (REQUEST_RESPONSE)
"use strict";

// Node 20 lacks Promise.withResolvers, which the SDK uses on every invocation.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

const http = require("node:http");
const http2 = require("node:http2");
const restate = require("@restatedev/restate-sdk");

const counter = restate.object({
  name: "TsCounter",
  handlers: {
    add: async (ctx, by) => {
      const next = ((await ctx.get("count")) ?? 0) + by;
      ctx.set("count", next);
      return next;
    },
    get: restate.handlers.object.shared(async (ctx) => (await ctx.get("count")) ?? 0),
  },
});

// The newest awakeable `awaitAwakeable` waits on.
let lastAwakeable = "";

const greeter = restate.service({
  name: "TsGreeter",
  handlers: {
    greet: async (_ctx, name) => `Hello, ${name}!`,
    // Calls TsCounter/<key>/add(1) and answers its result.
    addVia: async (ctx, key) => ctx.objectClient(counter, key).add(1),
    awaitAwakeable: async (ctx) => {
      const { id, promise } = ctx.awakeable();
      lastAwakeable = id;
      return promise;
    },
    lastAwakeable: async () => lastAwakeable,
  },
});

// How many `TsMeter/hold` run at once in this process, and the most seen.
let holding = 0;
let mostHolding = 0;

// Calls (or sends) `TsMeter/<method>` from a handler in `scope` under `limitKey`: protocol V7
// carries both on the Call and OneWayCall commands.
const scoped = (scope, limitKey, method, parameter) => ({
  service: "TsMeter",
  method,
  parameter,
  scope,
  limitKey,
  inputSerde: restate.serde.json,
  outputSerde: restate.serde.json,
});

const meter = restate.service({
  name: "TsMeter",
  handlers: {
    // Holds for `millis` (not durably: the slot stays taken), counting how many hold at once.
    hold: async (_ctx, millis) => {
      holding += 1;
      mostHolding = Math.max(mostHolding, holding);
      try {
        await new Promise((resolve) => setTimeout(resolve, millis));
      } finally {
        holding -= 1;
      }
      return millis;
    },
    peak: async () => mostHolding,
    // Reports `amount` as what it spent (`ctx.run` steps named `sluice:cost`), in two steps
    // around a durable sleep, and answers it.
    spend: async (ctx, amount) => {
      const first = Math.floor(amount / 2);
      await ctx.run("sluice:cost", () => first);
      await ctx.sleep(20);
      await ctx.run("sluice:cost", () => amount - first);
      return amount;
    },
    // The scope and limit key this invocation started with (V7 StartMessage).
    whoami: async (ctx) => ({
      scope: ctx.request().scope ?? null,
      limitKey: ctx.request().limitKey ?? null,
    }),
    // Calls `hold(millis)` `calls` times at once in `scope` under `limitKey`.
    fanOut: async (ctx, { scope, limitKey, calls, millis }) => {
      const all = [];
      for (let i = 0; i < calls; i++) {
        all.push(ctx.genericCall(scoped(scope, limitKey, "hold", millis)));
      }
      await restate.RestatePromise.all(all);
      return calls;
    },
    // Sends `hold(millis)` `sends` times in `scope` under `limitKey`.
    sendHolds: async (ctx, { scope, limitKey, sends, millis }) => {
      for (let i = 0; i < sends; i++) {
        ctx.genericSend(scoped(scope, limitKey, "hold", millis));
      }
      return sends;
    },
    // Asks `whoami` in `scope` under `limitKey`.
    askWho: async (ctx, { scope, limitKey }) =>
      ctx.genericCall(scoped(scope, limitKey, "whoami", null)),
  },
});

const [port, mode] = process.argv.slice(2);
if (!port || !["h1", "h2"].includes(mode)) {
  console.error("usage: node deployment.js <port> <h1|h2>");
  process.exit(2);
}

const endpoint = restate.endpoint().bind(greeter).bind(counter).bind(meter);
const server =
  mode === "h2"
    ? http2.createServer(endpoint.http2Handler())
    : http.createServer(endpoint.http1Handler());
server.listen(Number(port), "127.0.0.1", () => {
  console.log(`listening on ${port} (${mode})`);
});

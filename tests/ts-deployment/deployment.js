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

const [port, mode] = process.argv.slice(2);
if (!port || !["h1", "h2"].includes(mode)) {
  console.error("usage: node deployment.js <port> <h1|h2>");
  process.exit(2);
}

const endpoint = restate.endpoint().bind(greeter).bind(counter);
const server =
  mode === "h2"
    ? http2.createServer(endpoint.http2Handler())
    : http.createServer(endpoint.http1Handler());
server.listen(Number(port), "127.0.0.1", () => {
  console.log(`listening on ${port} (${mode})`);
});

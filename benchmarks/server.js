// A fast HTTP/1.1 keep-alive (or h2c) server for the benchmarks, so that the Python client
// is what gets measured.  Started by benchmarks/harness.py as a subprocess.
//
//   node benchmarks/server.js [--ports N] [--host 127.0.0.1]
//                             [--http2 [--max-concurrent-streams 100]]
//
// Listens on N ports (default 1) of HOST, which must be a loopback address, each port an
// origin of its own; prints one JSON line {"host": ..., "ports": [...]} once all listen.
// With --http2 each port speaks HTTP/2 over cleartext with prior knowledge only (h2c,
// ``http2.createServer``; no HTTP/1.1, no Upgrade), announcing SETTINGS_MAX_CONCURRENT_STREAMS
// of --max-concurrent-streams (default 100).
// Exits when its stdin closes (so it never outlives the harness) or on SIGTERM/SIGINT.
//
// Commands, one per line on stdin, each answered by one JSON line on stdout:
//   stats   {"ports": [{"port", "connections", "open", "requests", "max_streams"}, ...]}:
//           per port, TCP connections accepted and open now, requests (streams) started,
//           and the most requests seen in flight at once on one connection (1 for HTTP/1.1)
//   reset   zero those counters (connections open stay counted as open); answers {"ok": true}
//
// Routes (any method; a request body is read and dropped):
//   /            200 "ok" at once
//   /slow?ms=N   200 "ok" after N milliseconds (the timer is dropped if the client goes away)
"use strict";

const http = require("http");
const http2 = require("http2");

function parseArgs(argv) {
  const args = { ports: 1, host: "127.0.0.1", http2: false, maxConcurrentStreams: 100 };
  for (let i = 0; i < argv.length; ) {
    const name = argv[i];
    if (name === "--http2") {
      args.http2 = true;
      i += 1;
      continue;
    }
    const value = argv[i + 1];
    if (name === "--ports") args.ports = Number.parseInt(value, 10);
    else if (name === "--host") args.host = value;
    else if (name === "--max-concurrent-streams") args.maxConcurrentStreams = Number(value);
    else throw new Error(`unknown argument ${name}`);
    i += 2;
  }
  if (!(args.ports >= 1)) throw new Error("--ports must be >= 1");
  if (!args.host.startsWith("127.")) throw new Error("--host must be a loopback address");
  const n = args.maxConcurrentStreams;
  if (!Number.isInteger(n) || n < 1 || n > 2 ** 31 - 1) {
    throw new Error("--max-concurrent-streams must be an integer >= 1");
  }
  return args;
}

const BODY = Buffer.from("ok");
const HEADERS = { "Content-Type": "text/plain", "Content-Length": BODY.length };
const H2_HEADERS = { ":status": 200, "content-type": "text/plain", "content-length": BODY.length };

function delayOf(url) {
  if (!url.startsWith("/slow")) return 0;
  const match = /[?&]ms=(\d+)/.exec(url);
  return match ? Number.parseInt(match[1], 10) : 0;
}

// -- accounting (per port) ---------------------------------------------------------------
function newCounters() {
  return { connections: 0, open: 0, requests: 0, max_streams: 0 };
}

// One connection: counts its requests in flight (HTTP/2 streams; 0 or 1 for HTTP/1.1).
function track(counters, emitter) {
  counters.connections += 1;
  counters.open += 1;
  const conn = { inFlight: 0 };
  emitter.once("close", () => {
    counters.open -= 1;
  });
  return conn;
}

function started(counters, conn, closable) {
  counters.requests += 1;
  conn.inFlight += 1;
  if (conn.inFlight > counters.max_streams) counters.max_streams = conn.inFlight;
  closable.once("close", () => {
    conn.inFlight -= 1;
  });
}

// -- HTTP/1.1 ------------------------------------------------------------------------------
function listenHttp1(host, counters) {
  const server = http.createServer((req, res) => {
    counters.requests += 1; // one at a time per connection: no per-request listener
    counters.max_streams = 1;
    const respond = () => {
      res.writeHead(200, HEADERS);
      res.end(BODY);
    };
    req.resume(); // read and drop any request body, so the connection stays usable
    const ms = delayOf(req.url);
    if (ms > 0) {
      const timer = setTimeout(respond, ms);
      res.on("close", () => clearTimeout(timer));
    } else {
      respond();
    }
  });
  server.on("connection", (socket) => track(counters, socket));
  server.keepAliveTimeout = 120_000; // longer than any benchmark: the client decides
  server.headersTimeout = 0;
  server.requestTimeout = 0;
  server.maxRequestsPerSocket = 0;
  return server;
}

// -- HTTP/2 (h2c, prior knowledge) ----------------------------------------------------------
function listenHttp2(host, counters, maxConcurrentStreams) {
  const sessions = new WeakMap();
  const server = http2.createServer({ settings: { maxConcurrentStreams } });
  server.on("session", (session) => {
    sessions.set(session, track(counters, session));
    session.on("error", () => {}); // a client going away is not the server's problem
  });
  server.on("stream", (stream, headers) => {
    const conn = sessions.get(stream.session);
    if (conn) started(counters, conn, stream);
    else counters.requests += 1;
    stream.on("error", () => {}); // reset by the client
    stream.resume(); // read and drop any request body
    const respond = () => {
      if (stream.destroyed || stream.closed) return;
      stream.respond(H2_HEADERS);
      stream.end(BODY);
    };
    const ms = delayOf(headers[":path"] || "/");
    if (ms > 0) {
      const timer = setTimeout(respond, ms);
      stream.on("close", () => clearTimeout(timer));
    } else {
      respond();
    }
  });
  server.timeout = 0;
  return server;
}

function listen(args, counters) {
  const server = args.http2
    ? listenHttp2(args.host, counters, args.maxConcurrentStreams)
    : listenHttp1(args.host, counters);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen({ host: args.host, port: 0, backlog: 4096 }, () => resolve(server));
  });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const servers = [];
  const counters = [];
  for (let i = 0; i < args.ports; i++) {
    counters.push(newCounters());
    servers.push(await listen(args, counters[i]));
  }
  const ports = servers.map((s) => s.address().port);
  const reply = (value) => process.stdout.write(JSON.stringify(value) + "\n");
  const command = (line) => {
    const cmd = line.trim();
    if (cmd === "stats") {
      reply({ ports: counters.map((c, i) => ({ port: ports[i], ...c })) });
    } else if (cmd === "reset") {
      for (const c of counters) Object.assign(c, { connections: 0, requests: 0, max_streams: 0 });
      reply({ ok: true });
    } else if (cmd !== "") {
      reply({ error: `unknown command ${JSON.stringify(cmd)}` });
    }
  };
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  let pending = "";
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (chunk) => {
    pending += chunk;
    let newline;
    while ((newline = pending.indexOf("\n")) >= 0) {
      command(pending.slice(0, newline));
      pending = pending.slice(newline + 1);
    }
  });
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
  reply({ host: args.host, http2: args.http2, ports });
}

main().catch((err) => {
  process.stderr.write(`server.js: ${err.stack || err}\n`);
  process.exit(2);
});

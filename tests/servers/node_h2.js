// An HTTP/2 server on Node's own stack (nghttp2), for tests/servers/node.py.
//
//   node node_h2.js --max-concurrent-streams N [--cert chain.pem --key key.pem]
//
// Without --cert: h2c only (http2.createServer, prior knowledge). With it: TLS, ALPN
// h2 + http/1.1 (http2.createSecureServer, allowHTTP1). Both listen on 127.0.0.1:0.
// A separate plain HTTP/1.1 *control* server (127.0.0.1:0) serves the test:
//   GET /stats                 -> JSON, see stats() below
//   GET /release/<name>        -> answer requests held on <name>, and later ones at once
//   GET /wait-held/<name>/<k>  -> long poll: 200 once k requests were ever held on <name>
//                                 (408 after ?timeout=<ms>, default 10000)
//   GET /wait-idle             -> long poll: 200 once no h2 stream is open (408 likewise)
//   GET /reset                 -> zero the counters and forget released names
// Once both listen, one line of JSON goes to stdout: {"port": P, "controlPort": C}.
// The process exits on SIGTERM/SIGINT or when stdin closes (so it never outlives the
// Python side).
//
// Data server routes: "/" -> "hello"; "/hold/<name>" -> "released:<name>" once released;
// "/bytes/<n>" -> n bytes of "x"; "/upload" -> "received:<n>" once the whole request body
// (n bytes) is read; "/status/<code>" -> that status; "/early/<status>" -> that status at
// once, the request body never read; anything else -> 404 "not found". Every response has
// x-session (h2 session number, "h1" for HTTP/1.1) and x-stream-id (h2 only). Node answers
// "expect: 100-continue" with 100 itself (no 'checkContinue' listener).
// "/adv?..." plays an adversary plan (tests/adversary/plans.py): the modes and effects Node
// can be made to play (ok, early, reset, refuse, hang, stall; 1xx, SETTINGS caps and
// windows, GOAWAY, PING, abrupt close).
"use strict";

const fs = require("fs");
const http = require("http");
const http2 = require("http2");

function parseArgs(argv) {
  const args = { maxConcurrentStreams: 100, cert: null, key: null };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === "--max-concurrent-streams") args.maxConcurrentStreams = Number(value);
    else if (flag === "--cert") args.cert = value;
    else if (flag === "--key") args.key = value;
    else throw new Error(`unknown argument ${flag}`);
  }
  const n = args.maxConcurrentStreams;
  if (!Number.isInteger(n) || n < 0 || n > 2 ** 32 - 1) {
    throw new RangeError(`invalid --max-concurrent-streams ${n}`);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));

// ---- accounting

const state = {
  sessions: 0,
  openStreams: 0,
  maxOpenStreams: 0,
  maxStreamsPerSession: 0,
  totalStreams: 0,
  held: new Map(), // name -> Set of pending responses
  entered: new Map(), // name -> count ever held
  released: new Set(),
};
const perSession = new Map(); // session -> {id, open, max, live}
let nextSessionId = 0;
const waiters = new Set(); // {check: () => bool, done: () => void}

function stats() {
  const held = {};
  for (const [name, set] of state.held) held[name] = set.size;
  return {
    maxOpenStreams: state.maxOpenStreams,
    openStreams: state.openStreams,
    sessions: state.sessions,
    maxStreamsPerSession: state.maxStreamsPerSession,
    totalStreams: state.totalStreams,
    held,
    entered: Object.fromEntries(state.entered),
    perSession: [...perSession.values()].map((s) => ({ id: s.id, open: s.open, max: s.max, live: s.live })),
  };
}

function checkWaiters() {
  for (const w of [...waiters]) {
    if (w.check()) {
      waiters.delete(w);
      w.done();
    }
  }
}

function trackSession(session) {
  state.sessions += 1;
  nextSessionId += 1;
  perSession.set(session, { id: nextSessionId, open: 0, max: 0, live: true });
  session.on("close", () => {
    const s = perSession.get(session);
    if (s) s.live = false;
  });
  session.on("error", () => {}); // a client vanishing mid-session is not our problem
}

function trackStream(stream) {
  const s = perSession.get(stream.session);
  if (!s) return;
  s.open += 1;
  s.max = Math.max(s.max, s.open);
  state.openStreams += 1;
  state.totalStreams += 1;
  state.maxOpenStreams = Math.max(state.maxOpenStreams, state.openStreams);
  state.maxStreamsPerSession = Math.max(state.maxStreamsPerSession, s.max);
  stream.on("error", () => {});
  stream.once("close", () => {
    s.open -= 1;
    state.openStreams -= 1;
    checkWaiters();
  });
}

// ---- data server

function respond(req, res, status, body) {
  const session = req.stream ? String(perSession.get(req.stream.session)?.id ?? "?") : "h1";
  const headers = { "content-type": "text/plain", "content-length": Buffer.byteLength(body) };
  headers["x-session"] = session;
  if (req.stream) headers["x-stream-id"] = String(req.stream.id);
  if (res.destroyed || res.writableEnded || (req.stream && req.stream.destroyed)) return;
  res.writeHead(status, headers);
  res.end(body);
}

// ---- the adversary's plans (tests/adversary/plans.py)

function bodyOf(size) {
  return Buffer.from("0123456789abcdef".repeat(Math.ceil(size / 16) + 1).slice(0, size));
}

function parsePlan(url) {
  const q = new URL(url, "http://x").searchParams;
  const num = (name, dflt) => (q.has(name) ? Number(q.get(name)) : dflt);
  return {
    mode: q.get("m") || "ok", status: num("s", 200), size: num("n", 0), interim: num("i", 0),
    trailers: num("tr", 0), code: num("c", 0), at: q.get("at") || "head", rstAfter: num("er", 0),
    cap: num("cap", -1), window: num("win", -1), windowBack: num("wb", 0), goaway: num("ga", 0),
    serverPing: num("sp", 0), close: num("close", 0),
  };
}

function connectionEffects(stream, plan) {
  const session = stream.session;
  if (plan.cap >= 0) session.settings({ maxConcurrentStreams: plan.cap });
  if (plan.window >= 0) {
    session.settings({ initialWindowSize: plan.window });
    if (plan.windowBack) {
      setTimeout(() => session.destroyed || session.settings({ initialWindowSize: 65535 }), plan.windowBack);
    }
  }
  if (plan.serverPing) session.ping(() => {});
  if (plan.goaway) session.goaway(0, Math.max(0, plan.goaway === 1 ? stream.id : stream.id - 2));
  if (plan.close) setTimeout(() => session.destroyed || session.destroy(), plan.close);
}

// The core stream API, not the compatibility one: its responses always wait for trailers,
// and Node 20 aborts (an assertion in Http2Stream::OnTrailers) when such a stream is
// destroyed with data pending, as a client's reset or ours does.
function answer(stream, plan, actual, resetCode = -1) {
  if (stream.destroyed || stream.headersSent) return;
  const headers = { ":status": plan.status, "content-length": plan.size };
  stream.respond(headers, { endStream: actual === 0 && resetCode < 0 });
  if (resetCode >= 0) {
    stream.write(bodyOf(actual), () => stream.destroyed || stream.close(resetCode));
  } else if (actual > 0) {
    stream.end(bodyOf(actual));
  }
  if (plan.rstAfter && resetCode < 0) {
    stream.on("finish", () => stream.destroyed || stream.close(0));
  }
}

function onAdversary(req) {
  const plan = parsePlan(req.url);
  const stream = req.stream;
  connectionEffects(stream, plan);
  if (stream.destroyed) return;
  if (plan.mode === "refuse") return stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
  if (plan.mode === "reset" && plan.at === "head") return stream.close(plan.code);
  if (plan.interim >= 1) stream.additionalHeaders({ ":status": 100 });
  if (plan.interim >= 2) stream.additionalHeaders({ ":status": 103, link: "</a.css>; rel=preload" });
  if (plan.mode === "early") return answer(stream, plan, plan.size);
  if (plan.mode === "stall") return stream.pause();
  stream.resume();
  stream.on("end", () => {
    if (plan.mode === "ok") answer(stream, plan, plan.size);
    else if (plan.mode === "reset") answer(stream, plan, Math.floor(plan.size / 2), plan.code);
    // hang: never answered
  });
}

function onRequest(req, res) {
  const path = req.url.split("?")[0];
  if (path === "/adv" && req.stream) return onAdversary(req);
  if (path.startsWith("/early/")) return respond(req, res, Number(path.slice(7)), "early");
  if (path === "/upload") {
    let received = 0;
    req.on("data", (chunk) => (received += chunk.length));
    req.on("end", () => respond(req, res, 200, `received:${received}`));
    return;
  }
  req.resume(); // drain any request body
  if (path === "/") return respond(req, res, 200, "hello");
  if (path.startsWith("/status/")) {
    const status = Number(path.slice(8));
    return respond(req, res, status, `status:${status}`);
  }
  if (path.startsWith("/bytes/")) return respond(req, res, 200, "x".repeat(Number(path.slice(7))));
  if (path.startsWith("/hold/") && path.length > 6) {
    const name = decodeURIComponent(path.slice(6));
    const body = `released:${name}`;
    state.entered.set(name, (state.entered.get(name) || 0) + 1);
    if (state.released.has(name)) {
      respond(req, res, 200, body);
    } else {
      if (!state.held.has(name)) state.held.set(name, new Set());
      const entry = { req, res, body };
      state.held.get(name).add(entry);
      res.on("close", () => {
        // answered, or cancelled by the client
        const set = state.held.get(name);
        if (set && set.delete(entry) && set.size === 0) state.held.delete(name);
      });
    }
    checkWaiters();
    return;
  }
  respond(req, res, 404, "not found");
}

const settings = { maxConcurrentStreams: args.maxConcurrentStreams };
const server = args.cert
  ? http2.createSecureServer({
      cert: fs.readFileSync(args.cert),
      key: fs.readFileSync(args.key),
      allowHTTP1: true,
      settings,
    })
  : http2.createServer({ settings });
server.on("session", trackSession);
server.on("stream", trackStream); // alongside the compat 'request' listener below
server.on("request", onRequest);

// ---- control server

function json(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

function longPoll(req, res, check) {
  const timeout = Number(new URL(req.url, "http://x").searchParams.get("timeout") || 10000);
  if (check()) return json(res, 200, stats());
  const waiter = {
    check,
    done: () => {
      clearTimeout(timer);
      json(res, 200, stats());
    },
  };
  const timer = setTimeout(() => {
    waiters.delete(waiter);
    json(res, 408, stats());
  }, timeout);
  waiters.add(waiter);
  res.on("close", () => {
    waiters.delete(waiter);
    clearTimeout(timer);
  });
}

const control = http.createServer((req, res) => {
  const parts = req.url.split("?")[0].split("/").slice(1).map(decodeURIComponent);
  if (parts[0] === "stats") return json(res, 200, stats());
  if (parts[0] === "release" && parts.length === 2) {
    const name = parts[1];
    state.released.add(name);
    const pending = [...(state.held.get(name) || [])];
    state.held.delete(name);
    for (const { req: r, res: s, body } of pending) respond(r, s, 200, body);
    return json(res, 200, { released: pending.length });
  }
  if (parts[0] === "wait-held" && parts.length === 3) {
    const [name, k] = [parts[1], Number(parts[2])];
    return longPoll(req, res, () => (state.entered.get(name) || 0) >= k);
  }
  if (parts[0] === "wait-idle") return longPoll(req, res, () => state.openStreams === 0);
  if (parts[0] === "reset") {
    Object.assign(state, { maxOpenStreams: state.openStreams, maxStreamsPerSession: 0 });
    Object.assign(state, { sessions: 0, totalStreams: 0, entered: new Map(), released: new Set() });
    for (const s of perSession.values()) s.max = s.open;
    for (const [session, s] of perSession) if (!s.live) perSession.delete(session);
    return json(res, 200, stats());
  }
  json(res, 404, { error: "not found" });
});

// ---- startup and shutdown

function listen(srv) {
  return new Promise((resolve, reject) => {
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => resolve(srv.address().port));
  });
}

function exit() {
  process.exit(0);
}
process.on("SIGTERM", exit);
process.on("SIGINT", exit);
process.stdin.on("end", exit);
process.stdin.on("error", exit);
process.stdin.resume();

Promise.all([listen(server), listen(control)]).then(
  ([port, controlPort]) => process.stdout.write(JSON.stringify({ port, controlPort }) + "\n"),
  (err) => {
    process.stderr.write(`listen failed: ${err}\n`);
    process.exit(1);
  },
);

// A dependency of limited capacity, for the adaptive-concurrency lab (benchmarks/adaptive_lab.py).
//
//   node benchmarks/capacity_server.js --ports 3 --service-ms 100 --phases 15:16,15:4,15:24
//
// Each port (on 127.0.0.1 only) is one dependency of its own: N workers, each serving one
// request at a time for service-ms milliseconds (times a uniform factor in [0.9, 1.1]), and
// a FIFO queue beyond them, so a request's latency grows with the requests in flight above
// N.  N follows the phases ("seconds:N,..."), counted from the "start" command; when N
// falls, requests already in service finish and nobody starts until fewer than N are busy;
// when it rises, queued requests start at once.  The last phase's N holds after the end.
// Prints one JSON line {"ports": [...]} once all listen; exits when stdin closes.
//
// With --sigma S, service times spread as a lognormal of sigma S around service-ms instead
// (0.5: the p99 three times the median; 1: an LLM's ten times).
//
// With --shed-queue Q, a request that finds Q already queued is answered 503 at once (a
// dependency that sheds its excess, as a server with a bounded queue or an overload
// manager does), without taking a worker.
//
// Commands on stdin, one JSON line answered each:
//   start   the phases begin now; answers {"ok": true}
//   stats   {"ports": [{"port", "served", "busy", "queued", "max_queued", "shed"}]}
"use strict";

const http = require("http");

function parseArgs(argv) {
  const args = { ports: 1, serviceMs: 100, phases: [[15, 16]], shedQueue: null, sigma: null };
  for (let i = 0; i < argv.length; i += 2) {
    const [key, value] = [argv[i], argv[i + 1]];
    if (key === "--ports") args.ports = Number(value);
    else if (key === "--service-ms") args.serviceMs = Number(value);
    else if (key === "--shed-queue") args.shedQueue = Number(value);
    else if (key === "--sigma") args.sigma = Number(value);
    else if (key === "--phases") args.phases = value.split(",").map((p) => p.split(":").map(Number));
    else throw new Error(`unknown argument ${key}`);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
let startedAt = null;

function capacity() {
  if (startedAt === null) return args.phases[0][1];
  let elapsed = (Date.now() - startedAt) / 1000;
  for (const [seconds, n] of args.phases) {
    if (elapsed < seconds) return n;
    elapsed -= seconds;
  }
  return args.phases[args.phases.length - 1][1];
}

function serviceFactor() {
  if (args.sigma === null) return 0.9 + 0.2 * Math.random();
  const u = 1 - Math.random(); // (0, 1]: a normal deviate by Box-Muller
  const normal = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * Math.random());
  return Math.exp(args.sigma * normal);
}

function dependency() {
  const state = { busy: 0, queue: [], served: 0, maxQueued: 0, shed: 0 };
  const pump = () => {
    while (state.queue.length > 0 && state.busy < capacity()) {
      const res = state.queue.shift();
      if (res.destroyed || !res.socket || res.socket.destroyed) continue; // the client went away
      state.busy += 1;
      const ms = args.serviceMs * serviceFactor();
      setTimeout(() => {
        state.busy -= 1;
        state.served += 1;
        if (!res.destroyed) res.end("ok");
        pump();
      }, ms);
    }
  };
  state.pump = pump;
  state.server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.setHeader("content-type", "text/plain");
      const full = state.busy >= capacity() && state.queue.length >= args.shedQueue;
      if (args.shedQueue !== null && full) {
        state.shed += 1;
        res.statusCode = 503;
        res.end("shed");
        return;
      }
      state.queue.push(res);
      state.maxQueued = Math.max(state.maxQueued, state.queue.length);
      pump();
    });
  });
  state.server.keepAliveTimeout = 30000;
  return state;
}

const deps = [];
let listening = 0;
for (let i = 0; i < args.ports; i++) {
  const dep = dependency();
  deps.push(dep);
  dep.server.listen(0, "127.0.0.1", () => {
    listening += 1;
    if (listening === args.ports) {
      process.stdout.write(JSON.stringify({ ports: deps.map((d) => d.server.address().port) }) + "\n");
    }
  });
}

// When a phase raises N, queued requests start at its first instant.
function schedulePumps() {
  let at = 0;
  for (const [seconds] of args.phases) {
    at += seconds;
    setTimeout(() => deps.forEach((d) => d.pump()), at * 1000 + 1);
  }
}

let buffer = "";
process.stdin.on("data", (chunk) => {
  buffer += chunk;
  let newline;
  while ((newline = buffer.indexOf("\n")) >= 0) {
    const command = buffer.slice(0, newline).trim();
    buffer = buffer.slice(newline + 1);
    if (command === "start") {
      startedAt = Date.now();
      schedulePumps();
      process.stdout.write(JSON.stringify({ ok: true }) + "\n");
    } else if (command === "stats") {
      const ports = deps.map((d) => ({
        port: d.server.address().port,
        served: d.served,
        busy: d.busy,
        queued: d.queue.length,
        max_queued: d.maxQueued,
        shed: d.shed,
      }));
      process.stdout.write(JSON.stringify({ ports }) + "\n");
    }
  }
});
process.stdin.on("end", () => process.exit(0));
process.on("SIGTERM", () => process.exit(0));

// A fast HTTP/1.1 keep-alive server for the benchmarks, so that the Python client is what
// gets measured.  Started by benchmarks/harness.py as a subprocess.
//
//   node benchmarks/server.js [--ports N] [--host 127.0.0.1]
//
// Listens on N ports (default 1) of HOST, which must be a loopback address, each port an
// origin of its own; prints one JSON line {"host": ..., "ports": [...]} once all listen.
// Exits when its stdin closes (so it never outlives the harness) or on SIGTERM/SIGINT.
//
// Routes (any method; a request body is read and dropped):
//   /            200 "ok" at once
//   /slow?ms=N   200 "ok" after N milliseconds (the timer is dropped if the client goes away)
"use strict";

const http = require("http");

function parseArgs(argv) {
  const args = { ports: 1, host: "127.0.0.1" };
  for (let i = 0; i < argv.length; i += 2) {
    const [name, value] = [argv[i], argv[i + 1]];
    if (name === "--ports") args.ports = Number.parseInt(value, 10);
    else if (name === "--host") args.host = value;
    else throw new Error(`unknown argument ${name}`);
  }
  if (!(args.ports >= 1)) throw new Error("--ports must be >= 1");
  if (!args.host.startsWith("127.")) throw new Error("--host must be a loopback address");
  return args;
}

const BODY = Buffer.from("ok");
const HEADERS = { "Content-Type": "text/plain", "Content-Length": BODY.length };

function delayOf(url) {
  if (!url.startsWith("/slow")) return 0;
  const match = /[?&]ms=(\d+)/.exec(url);
  return match ? Number.parseInt(match[1], 10) : 0;
}

function handle(req, res) {
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
}

function listen(host) {
  const server = http.createServer(handle);
  server.keepAliveTimeout = 120_000; // longer than any benchmark: the client decides
  server.headersTimeout = 0;
  server.requestTimeout = 0;
  server.maxRequestsPerSocket = 0;
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen({ host, port: 0, backlog: 4096 }, () => resolve(server));
  });
}

async function main() {
  const { ports, host } = parseArgs(process.argv.slice(2));
  const servers = [];
  for (let i = 0; i < ports; i++) servers.push(await listen(host));
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
  process.stdout.write(
    JSON.stringify({ host, ports: servers.map((s) => s.address().port) }) + "\n",
  );
}

main().catch((err) => {
  process.stderr.write(`server.js: ${err.stack || err}\n`);
  process.exit(2);
});

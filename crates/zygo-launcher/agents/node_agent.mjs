// Zygo's Node spare: one pre-started Node process that has imported the handler and serves
// exactly one request, then exits. Node cannot fork safely, so the zygote's Python agent
// forks a registered child per slot (docs/agent-protocol.md) which execs this file:
//
//   node /run/zygo/node_agent.mjs ENTRY FUNC WORKDIR     (serve one request)
//   node /run/zygo/node_agent.mjs --pool WORKDIR         (serve one request of a runtime
//                                                         pool: import the script it names)
//   node /run/zygo/node_agent.mjs --check ENTRY FUNC     (import only; exit 0 or print why)
//
// fd 3 is the request channel (JSON lines, as for a Python child); fd 1 and fd 2 are pipes
// the launcher reads and relays (console.log and subprocesses alike). FUNC empty means the
// module's default export, else its `handler` export. Trusts nothing the handler does.

import fs from "node:fs";
import net from "node:net";
import { pathToFileURL } from "node:url";

const MAX_REQUEST_LINE = 20 << 20;
const MAX_PROGRESS = 64 << 10;
// What of an error is sent, in characters, as the Python agent: the message's beginning, the
// stack's end (where the error is). The launcher cuts again, in bytes, whatever a line says.
const MAX_MESSAGE = 64 << 10;
const MAX_TRACEBACK = 1 << 20;

async function load(entry, funcName) {
  const mod = await import(pathToFileURL(entry).href);
  // A CommonJS module's exports object arrives as its default export.
  const fn = funcName
    ? mod[funcName]
    : typeof mod.default === "function"
      ? mod.default
      : (mod.handler ?? mod.default?.handler);
  if (typeof fn !== "function") {
    const what = funcName ? `no function ${JSON.stringify(funcName)}` : "no default export and no `handler` export";
    throw new Error(`${entry} has ${what}`);
  }
  return fn;
}

// Text that UTF-8 can carry: a lone surrogate becomes "?" (as the Python agent's encoding
// makes it), or the launcher would refuse the line its escape is written in.
function wellFormed(s) {
  return s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "?");
}

// The first `n` characters of `s` (a surrogate pair is one, never split).
function head(s, n) {
  let i = 0;
  for (let count = 0; count < n && i < s.length; count++) {
    i += s.codePointAt(i) > 0xffff ? 2 : 1;
  }
  return wellFormed(s.slice(0, i));
}

// The last `n` characters of `s`.
function tail(s, n) {
  let j = s.length;
  for (let count = 0; count < n && j > 0; count++) {
    const low = s.charCodeAt(j - 1);
    const pair = low >= 0xdc00 && low <= 0xdfff && j >= 2 && (s.charCodeAt(j - 2) & 0xfc00) === 0xd800;
    j -= pair ? 2 : 1;
  }
  return wellFormed(s.slice(j));
}

// What was thrown, in one line's worth: never throws itself (a getter of the thrown value
// may).
function describe(e) {
  let text;
  try {
    text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  } catch {
    text = "<unprintable>";
  }
  return head(text, MAX_MESSAGE);
}

function stackOf(e) {
  try {
    return tail(String(e?.stack ?? ""), MAX_TRACEBACK);
  } catch {
    return "";
  }
}

if (process.argv[2] === "--check") {
  try {
    await load(process.argv[3], process.argv[4]);
    process.exit(0);
  } catch (e) {
    const message = head(`cannot import ${process.argv[3]}: ${describe(e)}`, MAX_MESSAGE);
    fs.writeSync(2, JSON.stringify({ message, traceback: stackOf(e) }) + "\n");
    process.exit(1);
  }
}

const pool = process.argv[2] === "--pool";
const [entry, funcName, workdir] = pool ? [null, "", process.argv[3]] : process.argv.slice(2);
if (!/^[0-9a-f]{32}$/.test(workdir ?? "")) {
  fs.writeSync(2, "node_agent: the request's directory must be named by 32 hex digits\n");
  process.exit(2);
}
const SCRIPT = /^\/run\/script\/[0-9a-f]{64}$/;
const channel = new net.Socket({ fd: 3, readable: true, writable: true });
let closed = false;
function send(obj) {
  if (!closed) channel.write(JSON.stringify(obj) + "\n");
}

let handler = null;
let importError = null;
if (!pool) {
  try {
    handler = await load(entry, funcName);
  } catch (e) {
    importError = e;
  }
}

function strictRequest(line) {
  const obj = JSON.parse(line);
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new Error("not an object");
  const keys = Object.keys(obj).sort().join(",");
  const want = pool ? "event,id,kind,script" : "event,id,kind";
  if (keys !== want || obj.kind !== "request" || typeof obj.id !== "string") {
    throw new Error("not a request line");
  }
  if (pool && (typeof obj.script !== "string" || !SCRIPT.test(obj.script))) {
    throw new Error("a bad script path");
  }
  return obj;
}

async function run(line) {
  let request;
  try {
    request = strictRequest(line);
  } catch (e) {
    fs.writeSync(2, `node_agent: protocol violation on the request channel: ${describe(e)}\n`);
    process.exit(2);
  }
  const beat = setInterval(() => send({ kind: "heartbeat" }), 1000);
  // process.exit() while the handler runs: its answer, written before the process goes
  // (synchronously: nothing queued is written once 'exit' is emitted). 0 is a return of
  // nothing, as Python's sys.exit(0); any other code an error that carries it.
  process.on("exit", (code) => {
    if (closed) return;
    closed = true;
    // The status the process exits with, as the system has it.
    const status = Number(code) & 0xff;
    const line = status === 0
      ? { kind: "result", value: null }
      : { kind: "error", message: `the handler called process.exit(${status})`, traceback: "", exit_code: status };
    try {
      fs.writeSync(3, JSON.stringify(line) + "\n");
    } catch {
      // The channel is gone: the launcher sees the child end without an answer.
    }
  });
  let terminal;
  try {
    // The request's own directory, made by the launcher (and the workspace, if the call
    // carried one, already unpacked in it).
    process.chdir(`/work/${workdir}`);
    process.env.ZYGO_WORKSPACE = `/work/${workdir}`;
    if (pool) handler = await load(request.script, "");
    if (importError) throw importError;
    const event = request.event;
    // event.progress(text), whatever the event's JSON type. An object or an array gets
    // it as a property of its own that JSON.stringify does not see (unless the event has
    // a "progress" key, which stays the caller's); a string, a number or a boolean finds it
    // on its type's prototype (this process serves this one request and then exits). null
    // has no properties in JavaScript: that event comes as it is.
    const progress = {
      enumerable: false,
      configurable: true,
      writable: true,
      value: (text) => send({ kind: "progress", text: head(String(text), MAX_PROGRESS) }),
    };
    if (event !== null && typeof event === "object") {
      if (!Object.hasOwn(event, "progress")) Object.defineProperty(event, "progress", progress);
    } else if (typeof event === "string" || typeof event === "number" || typeof event === "boolean") {
      const proto = Object.getPrototypeOf(event);
      if (!Object.hasOwn(proto, "progress")) Object.defineProperty(proto, "progress", progress);
    }
    const value = await handler(event);
    let text;
    try {
      text = JSON.stringify(value === undefined ? null : value);
      if (text === undefined) throw new Error(`a ${typeof value} is not JSON`);
    } catch (e) {
      terminal = { kind: "error", message: head(`result is not JSON-serialisable: ${describe(e)}`, MAX_MESSAGE), traceback: "" };
    }
    terminal ??= { kind: "result", value: JSON.parse(text) };
  } catch (e) {
    terminal = { kind: "error", message: describe(e), traceback: stackOf(e) };
  }
  clearInterval(beat);
  // Writes to a pipe are synchronous in Node: what the handler printed is already there.
  send(terminal);
  closed = true;
  // The caller has its answer. The request's directory is left as it is: the launcher may
  // be packing it (a call with `out`), and it goes with the request's own /work when its
  // last process has.
  channel.end(() => process.exit(0));
  setTimeout(() => process.exit(0), 1000).unref();
}

let buf = "";
channel.setEncoding("utf8");
channel.on("data", (d) => {
  buf += d;
  const nl = buf.indexOf("\n");
  if (nl >= 0) {
    channel.removeAllListeners("data");
    channel.pause();
    run(buf.slice(0, nl));
  } else if (buf.length > MAX_REQUEST_LINE) {
    process.exit(2);
  }
});
channel.on("end", () => {
  if (!buf.includes("\n")) process.exit(0); // the slot was reaped before a request came
});
channel.on("error", () => process.exit(1));

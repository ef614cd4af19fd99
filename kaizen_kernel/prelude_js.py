"""Kernel-side code for Node kernels (tslab's JavaScript mode): the counterpart of
:mod:`kaizen_kernel.prelude_py`, sent as source text in silent executions.

Inside the kernel it provides what the Python prelude does:

* a per-execution byte budget shared by ``process.stdout`` and ``process.stderr``; past it,
  writes are dropped and one marker line carrying the per-kernel nonce tells the server output
  was truncated, so a flood is cut *before* the kernel packs it into stream messages. tslab
  installs fresh ``write`` functions on both streams at the start of every execution, so the
  streams' ``write`` is an accessor: each assignment is wrapped, and the assignment to stdout
  is also the signal that a new execution began (the budget is reset there);
* ``tools``: ``tools.available`` and ``await tools.call(name, args)``, a loopback HTTP client of
  the server's bridge (``node:http``; not ``fetch``, whose WebAssembly parser cannot reserve
  memory under the kernel's address-space limit) authenticated by the lease token, which lives
  in a closure rather than on any reachable object;
* the call's shared files under their own names in the working directory, as symlinks into the
  read-only resources directory (the same rule as ``prelude_py._link_shared_files``).

The server drives it through ``globalThis.__kaizen`` (non-enumerable): ``bind`` per lease.
``tools`` is also a top-level ``const`` of the install cell: tslab carries a cell's top-level
declarations into later cells, which is how user code (and its type checker) sees it.
"""

from __future__ import annotations

import json

from kaizen_kernel.prelude_py import MARKER_PREFIX

_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_CALL_TIMEOUT_MS = 60_000

_INSTALL = r"""
(() => {
  const g = globalThis;
  if (Object.prototype.hasOwnProperty.call(g, "__kaizen")) { return; }
  const CONFIG = __CONFIG__;
  const state = { cap: CONFIG.cap, remaining: CONFIG.cap, nonce: CONFIG.nonce,
                  url: null, token: null, available: [], links: {}, resourcesParent: null };
  // node:http, not fetch: undici's WebAssembly parser cannot reserve its memory under the
  // kernel's address-space limit.
  const http = require("http");
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const reset = () => { state.remaining = state.cap; };
  const marker = () => CONFIG.markerPrefix + state.cap + " bytes " + state.nonce + "]\n";

  const capped = (inner) => function (chunk, encoding, callback) {
    const done = typeof encoding === "function" ? encoding : callback;
    if (state.remaining <= 0) {
      if (typeof done === "function") { done(); }
      return true;
    }
    const text = typeof chunk === "string" ? chunk : decoder.decode(chunk);
    const data = encoder.encode(text);
    if (data.length <= state.remaining) {
      state.remaining -= data.length;
      return inner.call(this, text, encoding, callback);
    }
    // Cut on the byte budget; drop a trailing partial UTF-8 sequence rather than mangle it.
    const cut = decoder.decode(data.subarray(0, state.remaining)).replace(/\uFFFD+$/, "");
    state.remaining = 0;
    inner.call(this, cut);
    return inner.call(this, marker(), done);
  };

  for (const stream of [process.stdout, process.stderr]) {
    let wrapped = capped(stream.write);
    Object.defineProperty(stream, "write", {
      configurable: true,
      enumerable: true,
      get() { return wrapped; },
      set(fn) {
        wrapped = capped(fn);
        if (stream === process.stdout) { reset(); }
      },
    });
  }

  class ToolCallError extends Error {
    constructor(code, message) {
      super(code + ": " + message);
      this.name = "ToolCallError";
      this.code = code;
    }
  }

  const tools = {
    ToolCallError,
    get available() { return [...state.available]; },
    call(name, args) {
      if (!state.url || !state.token) {
        return Promise.reject(
          new ToolCallError("bridge_unavailable", "tool callbacks are not available here"));
      }
      const body = JSON.stringify({ tool: String(name), arguments: args ?? {} });
      return new Promise((resolve, reject) => {
        const request = http.request(state.url, {
          method: "POST",
          agent: false,
          timeout: CONFIG.timeoutMs,
          headers: { "Authorization": "Bearer " + state.token,
                     "Content-Type": "application/json",
                     "Content-Length": Buffer.byteLength(body) },
        }, (response) => {
          const chunks = [];
          let size = 0;
          response.on("data", (chunk) => {
            size += chunk.length;
            if (size > CONFIG.maxResponseBytes) {
              response.destroy();
              reject(new ToolCallError("response_too_large",
                                       "tool result exceeded the bridge bound"));
              return;
            }
            chunks.push(chunk);
          });
          response.on("end", () => {
            let payload = {};
            try { payload = JSON.parse(Buffer.concat(chunks).toString("utf8")); }
            catch (_error) { payload = {}; }
            const status = response.statusCode || 0;
            if (status < 200 || status >= 300) {
              const err = (payload && payload.error) || {};
              reject(new ToolCallError(String(err.code ?? "http_" + status),
                                       String(err.message ?? "refused")));
              return;
            }
            resolve(payload.result);
          });
        });
        request.on("timeout", () => {
          request.destroy(new Error("timeout"));
        });
        request.on("error", (/** @type {any} */ error) => {
          reject(new ToolCallError("bridge_unreachable",
                                   (error && (error.code || error.message)) || "Error"));
        });
        request.end(body);
      });
    },
    [Symbol.for("nodejs.util.inspect.custom")]() {
      return "<tools available=" + JSON.stringify(state.available) + ">";
    },
  };

  // The call's shared files under their own names here: symlinks into the read-only
  // directory. Earlier calls' links go first (this kernel's, or a sibling kernel's: named like
  // their target, in a sibling resources directory); the program's own files keep their names.
  const linkSharedFiles = (resourcesDir, resourcesManifest) => {
    const fs = require("fs");
    const path = require("path");
    const parents = new Set([state.resourcesParent,
                             resourcesDir ? path.dirname(resourcesDir) : null].filter(Boolean));
    let entries = [];
    try { entries = fs.readdirSync(".", { withFileTypes: true }); } catch (e) { return; }
    for (const entry of entries) {
      if (!entry.isSymbolicLink()) { continue; }
      try {
        const target = fs.readlinkSync(entry.name);
        const ours = path.basename(target) === entry.name &&
                     parents.has(path.dirname(path.dirname(target)));
        if (state.links[entry.name] === target || ours) { fs.unlinkSync(entry.name); }
      } catch (e) { /* left as it is */ }
    }
    const links = {};
    if (resourcesDir) { state.resourcesParent = path.dirname(resourcesDir); }
    if (resourcesDir && resourcesManifest) {
      let listed = [];
      try { listed = JSON.parse(resourcesManifest); } catch (e) { listed = []; }
      for (const item of Array.isArray(listed) ? listed : []) {
        const name = item && item.filename, target = item && item.path;
        if (typeof name !== "string" || typeof target !== "string" || !name ||
            name.includes("/") || name.startsWith(".")) { continue; }
        try {
          fs.lstatSync(name);
          continue;  // the program's own file keeps its name
        } catch (e) { /* free */ }
        try { fs.symlinkSync(target, name); links[name] = target; } catch (e) { /* skipped */ }
      }
    }
    state.links = links;
  };

  const bind = (workspace, url, token, available, cap, resourcesDir, resourcesManifest) => {
    if (workspace) {
      process.chdir(workspace);
      process.env.KAIZEN_WORKSPACE = workspace;
    }
    // The call's shared resources: both variables exist only while the call has files.
    if (resourcesDir && resourcesManifest) {
      process.env.KAIZEN_SHARED_RESOURCES_DIR = resourcesDir;
      process.env.KAIZEN_SHARED_RESOURCES_MANIFEST = resourcesManifest;
    } else {
      delete process.env.KAIZEN_SHARED_RESOURCES_DIR;
      delete process.env.KAIZEN_SHARED_RESOURCES_MANIFEST;
    }
    linkSharedFiles(resourcesDir, resourcesManifest);
    state.url = url;
    state.token = token;
    state.available = Array.from(available);
    state.cap = cap;
    reset();
  };
  Object.defineProperty(g, "__kaizen", { value: Object.freeze({ bind, tools }),
                                         enumerable: false });
})();
// A top-level binding, so later cells (and tslab's type checker) know ``tools``.
const tools = /** @type {any} */ (globalThis).__kaizen.tools;
"""


def install_source(cap: int, nonce: str) -> str:
    """Code that installs the capped streams and ``tools`` once per kernel."""
    config = json.dumps({"cap": int(cap), "nonce": nonce, "markerPrefix": MARKER_PREFIX,
                         "timeoutMs": _CALL_TIMEOUT_MS,
                         "maxResponseBytes": _MAX_RESPONSE_BYTES})
    return _INSTALL.replace("__CONFIG__", config)


def bind_source(workspace: str | None, url: str | None, token: str | None,
                available: list[str], cap: int, resources_dir: str | None = None,
                resources_manifest: str | None = None) -> str:
    args = json.dumps([workspace, url, token, list(available), int(cap), resources_dir,
                       resources_manifest])
    return f"globalThis.__kaizen.bind(...{args});\n"

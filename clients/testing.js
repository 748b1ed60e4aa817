// Test helper shared by the Node and TypeScript client tests: memsvc in a child process on
// free loopback ports (gRPC, and HTTP for the Connect protocol), with the bundled offline
// model and a throwaway data dir.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, openSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const PYTHON = process.env.MEMSVC_PYTHON ?? path.join(ROOT, ".venv", "bin", "python");

function freePort() {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Start memsvc; `ready(target, http)` must resolve once it answers (retried until it does).
 * `env`: variables for the server beside the test's; `stdout`: a file its output goes to.
 * @param {(target: string, http: string) => Promise<void>} ready
 * @param {{env?: Record<string, string>, stdout?: string}} [options]
 * @returns {Promise<{target: string, http: string, stop: () => Promise<void>}>}
 */
export async function startMemsvc(ready, { env = {}, stdout = undefined } = {}) {
  const port = await freePort();
  const httpPort = await freePort();
  const dataDir = mkdtempSync(path.join(os.tmpdir(), "memsvc-client-"));
  const child = spawn(
    PYTHON,
    [
      "-m", "memsvc", "serve", "--listen", `127.0.0.1:${port}`, "--http-listen",
      `127.0.0.1:${httpPort}`, "--data-dir", dataDir, "--log-level", "WARNING",
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        MEMSVC_EMBED_MODEL: "sentence-transformers/all-MiniLM-L6-v2",
        MEMSVC_METRICS_LISTEN: "",
        TQDM_DISABLE: "1",
        ...env,
      },
      stdio: ["ignore", stdout === undefined ? "inherit" : openSync(stdout, "w"), "inherit"],
    },
  );
  const target = `127.0.0.1:${port}`;
  const http = `http://127.0.0.1:${httpPort}`;
  // the data dir goes once the server has stopped: not under a store still writing to it
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, "exit");
      child.kill("SIGTERM");
      await exited;
    }
    rmSync(dataDir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 180_000;
  for (;;) {
    try {
      await ready(target, http);
      return { target, http, stop };
    } catch (err) {
      if (Date.now() > deadline || child.exitCode !== null) {
        await stop();
        throw err;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

// A small typed-by-JSDoc wrapper over @grpc/grpc-js + @grpc/proto-loader for memsvc.
//
// Loader options matter (see README "Calling from other languages"):
//   keepCase: true   field names as in the .proto (snake_case), as the README writes them;
//                    the default camelCase silently drops snake_case keys.
//   longs: String    int64 fields (turn_id, TurnRange.start/end, backlogs) as decimal
//                    strings: no Long objects, no precision loss above 2^53.
//   enums: String    SearchMode as its name ("SEARCH_MODE_HYBRID"); an unknown name is
//                    rejected by validateEnums below instead of being sent as 0.
//   defaults: true   unset fields arrive with their zero values.
import { fileURLToPath } from "node:url";
import path from "node:path";
import { createRequire } from "node:module";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
export const PROTO_DIR = path.resolve(here, "..", "..", "proto");
const GOOGLE_PROTOS = path.resolve(path.dirname(require.resolve("google-proto-files/package.json")));

export const LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

const definition = protoLoader.loadSync(path.join(PROTO_DIR, "memsvc/v1/memory.proto"), {
  ...LOADER_OPTIONS,
  includeDirs: [PROTO_DIR],
});
const MemoryService = grpc.loadPackageDefinition(definition).memsvc.v1.MemoryService;

// google.rpc.Status and its details, decoded with protobufjs (proto-loader's types only
// describe messages, they do not decode them).
const rpcRoot = new protobuf.Root();
rpcRoot.resolvePath = (_origin, target) =>
  target.startsWith("google/protobuf/") ? target : path.join(GOOGLE_PROTOS, target);
rpcRoot.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const Status = rpcRoot.lookupType("google.rpc.Status");

const SEARCH_MODES = new Set(
  definition["memsvc.v1.SearchMode"].type.value.map((v) => v.name),
);

/** Throws on a SearchMode name the contract does not have (proto-loader would send 0). */
function validateEnums(method, request) {
  if (method === "EmbedDb" && request.mode !== undefined && !SEARCH_MODES.has(request.mode)) {
    throw new TypeError(`mode: unknown SearchMode ${JSON.stringify(request.mode)}`);
  }
}

// As the Python client: gRPC's own retries of UNAVAILABLE (the server did nothing: starting,
// or every write slot taken), after the server's grpc-retry-pushback-ms when it sends one;
// requests up to the server's 16 MiB limit stay retryable (grpc-js keeps 256 KiB by default).
const CHANNEL_OPTIONS = {
  "grpc.service_config": JSON.stringify({
    methodConfig: [
      {
        name: [{ service: "memsvc.v1.MemoryService" }],
        retryPolicy: {
          maxAttempts: 3,
          initialBackoff: "0.5s",
          maxBackoff: "10s",
          backoffMultiplier: 2,
          retryableStatusCodes: ["UNAVAILABLE"],
        },
      },
    ],
  }),
  "grpc.per_rpc_retry_buffer_size": 32 * 1024 * 1024,
  "grpc.retry_buffer_size": 64 * 1024 * 1024,
  "grpc.max_receive_message_length": 64 * 1024 * 1024,
};

/**
 * Connect to memsvc. Every RPC becomes `await client.Method(request, {deadlineMs})`.
 * @param {string} target HOST:PORT
 * @param {{token?: string, credentials?: grpc.ChannelCredentials}} [options]
 */
export function connect(target, options = {}) {
  const stub = new MemoryService(
    target,
    options.credentials ?? grpc.credentials.createInsecure(),
    CHANNEL_OPTIONS,
  );
  const client = { close: () => stub.close() };
  for (const method of Object.keys(MemoryService.service)) {
    client[method] = (request = {}, { deadlineMs = 60_000 } = {}) =>
      new Promise((resolve, reject) => {
        validateEnums(method, request);
        const metadata = new grpc.Metadata();
        if (options.token) metadata.set("authorization", `Bearer ${options.token}`);
        stub[method](request, metadata, { deadline: Date.now() + deadlineMs }, (err, reply) =>
          err ? reject(err) : resolve(reply),
        );
      });
  }
  return client;
}

const TYPE_PREFIX = "type.googleapis.com/";

/**
 * The google.rpc.Status details of a failed call: {fieldViolations, errorInfo, retryDelayMs}.
 * @param {grpc.ServiceError} err
 */
export function errorDetails(err) {
  const raw = err.metadata?.get("grpc-status-details-bin")?.[0];
  const out = { fieldViolations: [], errorInfo: null, retryDelayMs: null };
  if (!raw) return out;
  const status = Status.decode(raw);
  for (const any of status.details) {
    const name = any.type_url.slice(TYPE_PREFIX.length);
    let type;
    try {
      type = rpcRoot.lookupType(name);
    } catch {
      continue; // a detail type this client does not know
    }
    const detail = type.toObject(type.decode(any.value), { longs: String, defaults: true });
    if (name === "google.rpc.BadRequest") {
      out.fieldViolations.push(...detail.field_violations.map((v) => ({ field: v.field, description: v.description })));
    } else if (name === "google.rpc.ErrorInfo") {
      out.errorInfo = { reason: detail.reason, domain: detail.domain };
    } else if (name === "google.rpc.RetryInfo") {
      const d = detail.retry_delay;
      out.retryDelayMs = Number(d.seconds ?? 0) * 1000 + Math.round((d.nanos ?? 0) / 1e6);
    }
  }
  return out;
}

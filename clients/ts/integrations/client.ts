// The Connect client of MemoryService that both integrations take: the app makes it
// (createClient(MemoryService, transport)) and owns its transport.
import type { Client } from "@connectrpc/connect";
import type { MemoryService } from "../gen/memsvc/v1/memory_pb.js";

export type MemoryClient = Client<typeof MemoryService>;

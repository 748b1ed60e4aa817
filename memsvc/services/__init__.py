"""The operations of memsvc, on the interfaces of memsvc.ports: ingest (build, append,
upsert), deletion (delete, retire, purge), projection (plan, embed, write), search (and
fusion), indexing (the worker's lease loop), control (pause, reindex, wait), bootstrap."""

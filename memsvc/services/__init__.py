"""The operations of memsvc, on the interfaces of memsvc.ports:

- writes: `ingest` (build, append, upsert), `turns` (which events are new, edits,
  duplicates or refused; the ids the server gives), `keyed_writes` (a retried write
  answered once), `deletion` (delete, retire, purge);
- the projection of the log into the store: `projection` (plan, reconcile), `plan_input`
  (what a replan reads), `render_processes` (where it lays out: here or in processes
  beside), `projection_write` (embed and write), `vectors` (through the embedding cache),
  `indexing` (the worker's lease loop), `bootstrap` (start-up steps), `audit` (the store
  checked against the log), `fleet` (one projection per fleet), `model_move` (the store
  rebuilt for a new model, the collection before dropped at the end);
- reads: `search`, `standing_rules` (the standing instructions beside the hits),
  `moving_search` (each conversation where it is whole during a model
  move), `fusion` (ranking algorithms), `selection` (which candidates are
  returned), `narrowing` (a late window hit's turns nearest the query), `recent_records`
  (records not read twice);
- running: `control` (pause, reindex, status, wait), `health` (log and disk),
  `embedder_watch` (whether the embedder answers)."""

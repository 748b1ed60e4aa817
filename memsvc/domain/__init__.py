"""The pure core. No I/O, no storage, no transport: everything else depends on this package
and it depends on nothing of memsvc.

- values: `types`, `records`, `errors`, `limits`, `ids`, `hashing`, `pages` (pages cut by
  bytes);
- input: `text` (cleaning, RFC 3339), `validation`, `oversize`;
- chunks: `chunking` (planning windows), `replanning` (where a plan can start again
  after a change), `rendering` (windows into records), `layout` (both, for an index
  step, in the server or a render process), `prefix`
  (context prefixes, intent tags), `keyphrases` (an English window's topic), `standing`
  (standing instructions), `quick_match` (the rule tables' searches, a substring test
  first), `vectors` (what a chunk's vector is made of);
- search: `bm25` (keyword terms, vectors and per-tenant statistics), `terms` (the words a
  hit matched);
- who and when: `access` (roles, prefixes), `deadline` (the call's deadline),
  `model_identity` (which vectors a model writes)."""

"""The pure core: types, errors, limits, ids, text cleaning, context prefixes, chunking and
validation. No I/O, no storage, no transport: everything else depends on this package and
it depends on nothing of memsvc."""

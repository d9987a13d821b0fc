"""The store: the only code that runs SQL.

* :mod:`~voltro_beat.store.database`: one store URL (PostgreSQL through psycopg 3, or SQLite),
  its engine, its schema (Alembic, :mod:`~voltro_beat.store.migrations`) and error wrapping;
* :mod:`~voltro_beat.store.dialect`: what differs between the two, behind one interface
  implemented by :mod:`~voltro_beat.store.postgresql` (with the firing path's hand-written
  statements) and :mod:`~voltro_beat.store.sqlite`; no other module compares dialects;
* :mod:`~voltro_beat.store.tables`: the tables, as SQLAlchemy Core metadata;
* :mod:`~voltro_beat.store.beat`: beat's side (claims, run rows, the publish fence), one
  object built on :mod:`~voltro_beat.store.leases` (recovery's writes) and
  :mod:`~voltro_beat.store.sweeps` (retention's);
* :mod:`~voltro_beat.store.registry`: the replica registry;
* :mod:`~voltro_beat.store.run_writer`: the worker's run ledger writes;
* :mod:`~voltro_beat.store.reads`: what the operator's command reads.

Every driver error is wrapped in :class:`~voltro_beat.exceptions.StoreError` here and nowhere
else.
"""

"""The abuse suite: what one tenant (or anyone who can open a connection) can do to another
tenant's latency, measured against a real gateway process (``make abuse``).

Each row runs an attack (:mod:`tools.abuse.rows`) in a process of its own while a victim
tenant, in this process, sends one-token chat requests one after another; the victim is
timed alone and under attack, in interleaved rounds, and the ratio of the two p99 latencies
gets a bootstrap interval (:mod:`tools.abuse.stats`). The CPU-side attacks run against the
real tokenizer with a stand-in engine behind it (:mod:`tools.abuse.stand_in`); the output
constraint attacks need the real engine. Items 4-8 of issue #23 are pass/fail rows from
their tests (:mod:`tools.abuse.checks`).
"""

"""Study C (Lex 2026): bounded-horizon local transformer training on CPUs.

data (enwik8 / TinyStories / embedded stand-ins) -> model (byte transformer cut into stages) -> methods (BP, Live
Local, Broadcast, RGC; serial) + async_runtime (one process per stage, shared-memory rings) -> runner (paired
cells) -> analysis (non-inferiority, throughput CIs, tables, figures, claims) ; bench (MFU, PSS ratio).
"""

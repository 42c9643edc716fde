"""Study C (Lex 2026): bounded-horizon local transformer training on CPUs.

data (enwik8 / TinyStories / any byte file / embedded stand-ins) -> model (byte transformer cut into stages) ->
methods (BP, Live Local, Broadcast, RGC; serial) + async_runtime (one forkserver-started process per stage,
shared-memory rings, stall supervisor) -> runner (paired cells, each method in a fresh process) -> aggregate
(tidy CSV) -> tables (non-inferiority, throughput CIs, best BP in budget) / figures / claims (evidence) ;
bench (MFU, PSS ratio).
"""

"""Study C (Lex 2026): bounded-horizon local transformer training on CPUs.

config (typed section) -> plan (cells, run directories) / rules (what the .smk asks) -> data (enwik8 / TinyStories /
any byte file / embedded stand-ins) -> train (paired cells, each method in a fresh process: model, methods (BP, Live
Local, Broadcast, RGC; serial) + async_runtime (one forkserver-started process per stage, shared-memory rings,
stall supervisor)) -> aggregate (tidy CSV) -> stats (non-inferiority, throughput CIs, best BP in budget) -> tables /
figures / claims (evidence) ; bench (MFU, PSS ratio) ; check (the paper's reported statistics recomputed).
"""

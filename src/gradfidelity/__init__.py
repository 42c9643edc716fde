"""gradfidelity: reproduce how training systems bend the gradient an optimizer really receives.

Study A (dropped micro-batches, studies/ds_audit + studies/sft_rl), study B (one-step delay, studies/async_pp),
study C (bounded-horizon local training, studies/local). Shared pieces: harness, stats, claims, plots.
"""

__version__ = "0.1.0"

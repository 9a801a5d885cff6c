"""The 0/1 verifier, used by training rewards, dev validation and test evaluation alike.

Pure core: no verl, TRL, transformers, MLflow or vLLM import (Math-Verify and sympy only, and
only on first use). Two graders (`GRADERS`, the pipeline config's `grader` key):

- `repexp` (default): one rule per answer family, more accurate than the paper's scorers
  (docs/data.md, "Agreement study");
- `paper`: the upstream recipe's three scorers, reproduced exactly (verl's strict GSM8K `####`,
  Hendrycks string equivalence for MATH, Math-Verify for DAPO/AIME), so numbers can be set
  beside the paper's.

Public API (every function takes `grader=`, default `"repexp"`): `score(data_source, response,
ground_truth)` (0.0 or 1.0); `extract_answer(data_source, response)` (the canonical final answer,
the maj@k voting key, or None); `score_answer(data_source, answer, ground_truth)` (an extracted
answer: the maj@k winner); `score_batch(...)` / `VerifierPool` (many responses, distinct
Math-Verify work once, in a process pool when it pays). Unknown data sources raise ValueError;
so do an empty gold and a non-numeric GSM8K gold.

Modules: `routing` (data_source → answer family or paper scorer; `GRADERS`), `extract` (the last
box, GSM8K's `####` lines), `normalize` (LaTeX normalisation), `compare` (Math-Verify, its size
guard and result cache), `paper` (the recipe's scorers), `scoring` (the public functions and
`VerifierPool`), `timeout` (`time_limit`, the in-thread CPU-time guard), `pool` (`ProcessPool`,
with a hard wall-clock limit per item).

Time: every Math-Verify key runs under a soft limit of `DEFAULT_TIMEOUT_S` (5) CPU seconds of
its thread and scores 0 when it overruns; string work is linear in the response length; the
pool kills a worker stuck for `3·timeout + 10` wall seconds in one C call.
"""

from repexp.verify.compare import DEFAULT_TIMEOUT_S, warm_up
from repexp.verify.extract import MAX_ANSWER_CHARS, last_boxed
from repexp.verify.normalize import normalize_answer
from repexp.verify.pool import default_workers
from repexp.verify.routing import DEFAULT_GRADER, GRADERS, GSM8K, MATH, family, paper_scorer
from repexp.verify.scoring import (
    MIN_POOL_ITEMS,
    VerifierPool,
    clear_caches,
    extract_answer,
    score,
    score_answer,
    score_batch,
)
from repexp.verify.timeout import VerifyTimeout, time_limit

__all__ = [
    "DEFAULT_GRADER", "DEFAULT_TIMEOUT_S", "GRADERS", "GSM8K", "MATH", "MAX_ANSWER_CHARS", "MIN_POOL_ITEMS",
    "VerifierPool", "VerifyTimeout", "clear_caches", "default_workers", "extract_answer", "family", "last_boxed",
    "normalize_answer", "paper_scorer", "score", "score_answer", "score_batch", "time_limit", "warm_up",
]

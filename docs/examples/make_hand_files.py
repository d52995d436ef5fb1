# Hand-made files standing in for a researcher's own: scores of 8 samples for 100 calibration prompts, a deployment
# log of 500 visits with 4 candidates each, and two decoded outputs on 60 test prompts scored by their own evaluator.
import numpy as np
import pandas as pd

rng = np.random.default_rng(0)
cost = rng.normal(0.0, 1.0, size=(100, 8))
pd.DataFrame({"prompt_id": np.repeat([f"cal{i}" for i in range(100)], 8), "sample_id": np.tile(range(8), 100),
              "reward": (0.8 * cost + rng.normal(0, 0.6, cost.shape)).ravel(), "cost": cost.ravel()}
             ).to_csv("my_scores.csv", index=False)
c = rng.normal(0.3, 1.0, size=(500, 4))
pd.DataFrame({"t": np.repeat(range(500), 4), "prompt_id": np.repeat([f"dep{i % 80}" for i in range(500)], 4),
              "sample_id": np.tile(range(4), 500), "reward": (0.8 * c + rng.normal(0, 0.6, c.shape)).ravel(),
              "cost": c.ravel()}).to_csv("my_stream.csv", index=False)

"""λ after deployment: the deployment prompt pool, the shift scenarios' streams, Best-of-N with an online λ
(and its certificate), the fixed-λ arms and the oracle beside it, the shift check and the weighted recalibration."""

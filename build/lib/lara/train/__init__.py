"""Training stages on TRL: SFT, Bradley-Terry reward and cost models, PARGS partial scorers
and CD-Q value functions. Each module is one ``lara train-*`` command."""

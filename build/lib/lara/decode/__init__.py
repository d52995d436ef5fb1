"""Decoding with the calibrated reward r - lambda c: Best-of-N (``lara.decode.bon``) and the
token-level decoders ARGS / PARGS / CD-Q (``lara.decode.rgtg``)."""

"""Evaluation of every decoded and policy output, the LLM judge, aggregation and figures."""

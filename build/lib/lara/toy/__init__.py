"""The embedded toy safety world: data generator, oracle, tokenizer and tiny models."""

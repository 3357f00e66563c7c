"""edge-infer's own measurements: one module per `edge-infer bench` subcommand, plus its helpers."""

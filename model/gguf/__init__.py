"""Users' own GGUF models (the files Ollama and LM Studio keep): naming one (`locate`) and reading its header
(`header`), light enough for a command to check `--model` before it loads anything."""

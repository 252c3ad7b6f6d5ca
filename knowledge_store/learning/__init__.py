"""What the product learns from each corpus: per-corpus fine-tuning of the embedding model (``finetune``) from
training pairs the corpus itself provides (``pairs``)."""

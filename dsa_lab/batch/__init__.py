"""The decode step as data, before any kernel runs: its paged cache, its batch of requests, the draft
lengths speculative decoding accepts, vLLM's metadata for each strategy and the launch plan that prices it."""

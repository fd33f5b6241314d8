"""Beam search, outside the engine's core: the rounds over token ids and logprobs (`search`), the searches'
sequences in the scheduler (`groups`), their candidate rows on the device (`rows`), the sampling fields it refuses
(`params`) and its final beams as choices (`choices`)."""

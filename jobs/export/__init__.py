"""The `replaylake export` job: trained data as shards with a manifest. `main` is the command;
rows picks and dresses the rows, manifest makes a run resumable, ray reads the lake with Ray Data."""

"""dsa_lab: the DSA indexer decode path (native vs flattened MTP), modelled, run and measured."""

ALTER TABLE spans MODIFY SETTING non_replicated_deduplication_window = 10000;

ALTER TABLE resource_samples MODIFY SETTING non_replicated_deduplication_window = 10000;


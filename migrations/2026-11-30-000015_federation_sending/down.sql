DROP TABLE federation_received_to_device;
DROP TABLE federation_received_txns;
DROP TABLE federation_outbox;
DROP TABLE federation_destinations;

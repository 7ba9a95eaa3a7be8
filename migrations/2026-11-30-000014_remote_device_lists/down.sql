DROP TABLE remote_devices;
DROP TABLE remote_device_lists;

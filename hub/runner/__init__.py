"""The runner protocol: hub side (`hubside`) and runner side (`agent`), sharing `protocol`."""

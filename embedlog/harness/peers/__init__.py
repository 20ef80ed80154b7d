"""The Java peers embedlog is tested and measured against: Apache BookKeeper (bookkeeper.py,
with our Java drivers bkdriver.py and bkmeta.py), Kafka (kafka.py) and Pulsar (pulsar.py),
their jars (jars.py) and JVM archives (jvmcds.py). Our Java programs are package data under
java/, so an installed embedlog runs them as a checkout does."""

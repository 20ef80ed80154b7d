"""TLS, the bookies' token and passwords, through Spark: options or files, never printed."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from embedlog.harness import LocalCluster


@pytest.fixture(scope="module")
def secure(spark, tmp_path_factory):
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("secure")), autorecovery=False,
                      proxies=False, tls=True, auth_token="spark-token-0123456789") as c:
        yield c


def test_tls_and_token_from_options_and_files(spark, secure, tmp_path):
    uri = secure.metadata_uri
    ca = secure.client_config["tls_ca_file"]
    token_file = secure.client_config["auth_token_file"]
    df = spark.range(0, 200, 1, 2).select(F.format_string("t%d", "id").alias("payload"))
    (df.write.format("embedlog").option("metadataServiceUri", uri).option("stream", "secured")
     .option("tlsCaFile", ca).option("authToken", "spark-token-0123456789")
     .option("password", "pw").mode("append").save())

    def read(**opts):
        r = spark.read.format("embedlog").option("metadataServiceUri", uri).option("streams", "secured")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    rows = read(tlsCaFile=ca, authTokenFile=token_file, password="pw").collect()
    assert sorted(bytes(r.payload) for r in rows) == sorted(b"t%d" % i for i in range(200))
    # the bookies refuse a client without the token; the message never shows the token
    with pytest.raises(Exception) as refused:
        read(tlsCaFile=ca, authToken="not-the-token", password="pw").collect()
    assert "token" in str(refused.value) and "not-the-token" not in str(refused.value)
    # and one that does not trust their certificate
    with pytest.raises(Exception, match="(?i)certificate|ssl|closed the connection"):
        read(authTokenFile=token_file, password="pw").collect()

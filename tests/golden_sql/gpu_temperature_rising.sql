WITH
    rows1 AS
    (
        SELECT
            node_id,
            device,
            labels_key,
            any(value) AS value,
            timestamp,
            '' AS cls
        FROM stethoscope.metrics
        WHERE (metric_name = {p2:String}) AND (timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')) AND (timestamp > (fromUnixTimestamp64Milli({at:Int64}, 'UTC') - toIntervalSecond({p7:UInt32})))
        GROUP BY
            node_id,
            device,
            labels_key,
            timestamp
    )
SELECT
    *,
    '' AS grp,
    1 AS peers
FROM
(
    SELECT
        node_id,
        any(dev) AS device,
        any(v) AS value,
        maxMap(`values`) AS all_values
    FROM
    (
        SELECT
            t0.node_id AS node_id,
            t0.key AS key,
            t0.dev AS dev,
            mapConcat(t0.`values`, t1.`values`, t2.`values`) AS `values`,
            t0.v AS v
        FROM
        (
            SELECT
                node_id,
                if(extract(device, {p1:String}) = '', device, extract(device, {p1:String})) AS key,
                argMax(device, (x, device)) AS dev,
                map({p2:String}, max(x)) AS `values`,
                max(x) AS v
            FROM
            (
                SELECT
                    node_id,
                    device,
                    labels_key,
                    cls,
                    cur AS x,
                    n
                FROM
                (
                    SELECT
                        node_id,
                        device,
                        labels_key,
                        any(cls) AS cls,
                        min(value) AS cur,
                        count() AS n
                    FROM rows1
                    GROUP BY
                        node_id,
                        device,
                        labels_key
                )
            )
            WHERE (n >= {p8:UInt32}) AND (x >= {p6:Float64})
            GROUP BY
                node_id,
                key
        ) AS t1
        INNER JOIN
        (
            SELECT
                node_id,
                if(extract(device, {p1:String}) = '', device, extract(device, {p1:String})) AS key,
                argMax(device, (x, device)) AS dev,
                map({p2:String}, max(x)) AS `values`,
                max(x) AS v
            FROM
            (
                SELECT
                    node_id,
                    device,
                    labels_key,
                    cls,
                    cur AS x,
                    n
                FROM
                (
                    SELECT
                        node_id,
                        device,
                        labels_key,
                        any(cls) AS cls,
                        if(count() < 2, 0, tupleElement(simpleLinearRegression(toFloat64(toUnixTimestamp64Milli(timestamp) - {at:Int64}) / 3600000, value), 1)) AS cur,
                        count() AS n
                    FROM rows1
                    GROUP BY
                        node_id,
                        device,
                        labels_key
                )
            )
            WHERE (n >= {p5:UInt32}) AND (x > {p9:Float64})
            GROUP BY
                node_id,
                key
        ) AS t2 ON (t1.node_id = t2.node_id) AND (t1.key = t2.key)
        INNER JOIN
        (
            SELECT
                node_id,
                if(extract(device, {p1:String}) = '', device, extract(device, {p1:String})) AS key,
                argMax(device, (x, device)) AS dev,
                map({p2:String}, max(x)) AS `values`,
                max(x) AS v
            FROM
            (
                SELECT
                    node_id,
                    device,
                    labels_key,
                    cls,
                    cur AS x,
                    n
                FROM
                (
                    SELECT
                        node_id,
                        device,
                        labels_key,
                        any(cls) AS cls,
                        avg(value) AS cur,
                        count() AS n
                    FROM
                    (
                        SELECT
                            node_id,
                            device,
                            labels_key,
                            any(value) AS value,
                            timestamp,
                            '' AS cls
                        FROM stethoscope.metrics
                        WHERE (metric_name = {p2:String}) AND (timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')) AND (timestamp > (fromUnixTimestamp64Milli({at:Int64}, 'UTC') - toIntervalSecond({p4:UInt32})))
                        GROUP BY
                            node_id,
                            device,
                            labels_key,
                            timestamp
                    )
                    GROUP BY
                        node_id,
                        device,
                        labels_key
                )
            )
            WHERE (n >= {p5:UInt32}) AND (x >= {p3:Float64})
            GROUP BY
                node_id,
                key
        ) AS t0 ON (t1.node_id = t0.node_id) AND (t1.key = t0.key)
    )
    GROUP BY
        node_id,
        key
)
ORDER BY
    node_id ASC,
    device ASC
-- parameters
{
 "at": 1767225600000,
 "p1": "^(gpu[0-9]+)",
 "p2": "gpu_temperature_celsius",
 "p3": 80.0,
 "p4": 1800,
 "p5": 1,
 "p6": 70.0,
 "p7": 3600,
 "p8": 30,
 "p9": 2.0
}

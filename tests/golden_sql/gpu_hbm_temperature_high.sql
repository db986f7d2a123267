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
 "p2": "gpu_memory_temperature_celsius",
 "p3": 95.0,
 "p4": 600,
 "p5": 3
}

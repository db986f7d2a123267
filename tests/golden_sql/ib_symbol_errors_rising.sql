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
            mapConcat(t0.`values`, t1.`values`) AS `values`,
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
                    WITH
                        samples AS
                        (
                            SELECT
                                node_id,
                                device,
                                labels_key,
                                arrayMap(t -> (t.2), arraySort(groupArrayIf((timestamp, value), timestamp > fromUnixTimestamp64Milli({p9:Int64}, 'UTC')))) AS inside,
                                countIf(timestamp > fromUnixTimestamp64Milli({p9:Int64}, 'UTC')) AS n,
                                argMaxIf(value, timestamp, NOT (timestamp > fromUnixTimestamp64Milli({p9:Int64}, 'UTC'))) AS before,
                                countIf(NOT (timestamp > fromUnixTimestamp64Milli({p9:Int64}, 'UTC'))) > 0 AS has_before
                            FROM
                            (
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    value,
                                    timestamp
                                FROM stethoscope.metrics
                                WHERE (metric_name = {p2:String}) AND (((timestamp >= fromUnixTimestamp64Milli({p7:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p8:Int64}, 'UTC'))) OR ((timestamp >= fromUnixTimestamp64Milli({p9:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p5:Int64}, 'UTC'))) OR ((timestamp >= fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p10:Int64}, 'UTC'))))
                                UNION ALL
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    value,
                                    timestamp
                                FROM stethoscope.metrics
                                WHERE (metric_name = {p2:String}) AND (timestamp >= fromUnixTimestamp64Milli({p5:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND ((node_id, device, labels_key, toStartOfHour(timestamp)) IN (
                                    SELECT
                                        node_id,
                                        device,
                                        labels_key,
                                        hour
                                    FROM stethoscope.metrics_hourly
                                    WHERE (metric_name = {p2:String}) AND (hour >= fromUnixTimestamp64Milli({p5:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p6:Int64}, 'UTC'))
                                    GROUP BY
                                        node_id,
                                        device,
                                        labels_key,
                                        hour
                                    HAVING min(min_value) < max(max_value)
                                ))
                                UNION ALL
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    if(hour < fromUnixTimestamp64Milli({p9:Int64}, 'UTC'), argMaxMerge(last_value), min(min_value)) AS value,
                                    max(last_at) AS timestamp
                                FROM stethoscope.metrics_hourly
                                WHERE (metric_name = {p2:String}) AND (((hour >= fromUnixTimestamp64Milli({p8:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p9:Int64}, 'UTC'))) OR ((hour >= fromUnixTimestamp64Milli({p5:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p6:Int64}, 'UTC'))))
                                GROUP BY
                                    node_id,
                                    device,
                                    labels_key,
                                    hour
                                HAVING (hour < fromUnixTimestamp64Milli({p9:Int64}, 'UTC')) OR (min(min_value) = max(max_value))
                            )
                            GROUP BY
                                node_id,
                                device,
                                labels_key
                            HAVING n > 0
                        )
                    SELECT
                        s.node_id AS node_id,
                        s.device AS device,
                        s.labels_key AS labels_key,
                        '' AS cls,
                        arraySum(arrayMap((a, b) -> if(b >= a, b - a, b), arrayPopBack(arrayPushFront(s.inside, if(s.has_before, s.before, if(d.found = 1, d.last, s.inside[1])))), arrayPopFront(arrayPushFront(s.inside, if(s.has_before, s.before, if(d.found = 1, d.last, s.inside[1])))))) AS cur,
                        s.n AS n
                    FROM samples AS s
                    LEFT JOIN
                    (
                        SELECT
                            node_id,
                            device,
                            labels_key,
                            argMaxMerge(last_value) AS last,
                            1 AS found
                        FROM stethoscope.metrics_daily
                        WHERE (metric_name = {p2:String}) AND (day <= toDate(fromUnixTimestamp64Milli({p11:Int64}, 'UTC')))
                        GROUP BY
                            node_id,
                            device,
                            labels_key
                    ) AS d USING (node_id, device, labels_key)
                )
            )
            WHERE (n >= {p12:UInt32}) AND (x > {p3:Float64})
            GROUP BY
                node_id,
                key
        ) AS t0
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
                    WITH
                        samples AS
                        (
                            SELECT
                                node_id,
                                device,
                                labels_key,
                                arrayMap(t -> (t.2), arraySort(groupArrayIf((timestamp, value), timestamp > fromUnixTimestamp64Milli({p17:Int64}, 'UTC')))) AS inside,
                                countIf(timestamp > fromUnixTimestamp64Milli({p17:Int64}, 'UTC')) AS n,
                                argMaxIf(value, timestamp, NOT (timestamp > fromUnixTimestamp64Milli({p17:Int64}, 'UTC'))) AS before,
                                countIf(NOT (timestamp > fromUnixTimestamp64Milli({p17:Int64}, 'UTC'))) > 0 AS has_before
                            FROM
                            (
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    value,
                                    timestamp
                                FROM stethoscope.metrics
                                WHERE (metric_name = {p2:String}) AND (((timestamp >= fromUnixTimestamp64Milli({p15:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p16:Int64}, 'UTC'))) OR ((timestamp >= fromUnixTimestamp64Milli({p17:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p6:Int64}, 'UTC'))) OR ((timestamp >= fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p10:Int64}, 'UTC'))))
                                UNION ALL
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    value,
                                    timestamp
                                FROM stethoscope.metrics
                                WHERE (metric_name = {p2:String}) AND (timestamp >= fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND (timestamp < fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND ((node_id, device, labels_key, toStartOfHour(timestamp)) IN (
                                    SELECT
                                        node_id,
                                        device,
                                        labels_key,
                                        hour
                                    FROM stethoscope.metrics_hourly
                                    WHERE (metric_name = {p2:String}) AND (hour >= fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p6:Int64}, 'UTC'))
                                    GROUP BY
                                        node_id,
                                        device,
                                        labels_key,
                                        hour
                                    HAVING min(min_value) < max(max_value)
                                ))
                                UNION ALL
                                SELECT
                                    node_id,
                                    device,
                                    labels_key,
                                    if(hour < fromUnixTimestamp64Milli({p17:Int64}, 'UTC'), argMaxMerge(last_value), min(min_value)) AS value,
                                    max(last_at) AS timestamp
                                FROM stethoscope.metrics_hourly
                                WHERE (metric_name = {p2:String}) AND (((hour >= fromUnixTimestamp64Milli({p16:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p17:Int64}, 'UTC'))) OR ((hour >= fromUnixTimestamp64Milli({p6:Int64}, 'UTC')) AND (hour < fromUnixTimestamp64Milli({p6:Int64}, 'UTC'))))
                                GROUP BY
                                    node_id,
                                    device,
                                    labels_key,
                                    hour
                                HAVING (hour < fromUnixTimestamp64Milli({p17:Int64}, 'UTC')) OR (min(min_value) = max(max_value))
                            )
                            GROUP BY
                                node_id,
                                device,
                                labels_key
                            HAVING n > 0
                        )
                    SELECT
                        s.node_id AS node_id,
                        s.device AS device,
                        s.labels_key AS labels_key,
                        '' AS cls,
                        arraySum(arrayMap((a, b) -> if(b >= a, b - a, b), arrayPopBack(arrayPushFront(s.inside, if(s.has_before, s.before, if(d.found = 1, d.last, s.inside[1])))), arrayPopFront(arrayPushFront(s.inside, if(s.has_before, s.before, if(d.found = 1, d.last, s.inside[1])))))) AS cur,
                        s.n AS n
                    FROM samples AS s
                    LEFT JOIN
                    (
                        SELECT
                            node_id,
                            device,
                            labels_key,
                            argMaxMerge(last_value) AS last,
                            1 AS found
                        FROM stethoscope.metrics_daily
                        WHERE (metric_name = {p2:String}) AND (day <= toDate(fromUnixTimestamp64Milli({p18:Int64}, 'UTC')))
                        GROUP BY
                            node_id,
                            device,
                            labels_key
                    ) AS d USING (node_id, device, labels_key)
                )
            )
            WHERE (n >= {p12:UInt32}) AND (x > {p13:Float64})
            GROUP BY
                node_id,
                key
        ) AS t1 ON (t0.node_id = t1.node_id) AND (t0.key = t1.key)
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
 "p1": "^([^/]+)",
 "p10": 1767225600001,
 "p11": 1767031200000,
 "p12": 1,
 "p13": 10.0,
 "p15": 1767049200001,
 "p16": 1767052800000,
 "p17": 1767222000000,
 "p18": 1767049200000,
 "p2": "ib_symbol_errors_total",
 "p3": 60.0,
 "p5": 1767207600000,
 "p6": 1767225600000,
 "p7": 1767031200001,
 "p8": 1767034800000,
 "p9": 1767204000000
}

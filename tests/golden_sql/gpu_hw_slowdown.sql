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
            map({p2:String}, max(x), {p4:String}, toFloat64(argMax(m, (x, device))), {p5:String}, toFloat64(argMax(n, (x, device)))) AS `values`,
            max(x) AS v
        FROM
        (
            SELECT
                node_id,
                device,
                labels_key,
                cls,
                cur AS x,
                n,
                m
            FROM
            (
                SELECT
                    node_id,
                    device,
                    labels_key,
                    any(cls) AS cls,
                    toFloat64(groupBitOrIf(toUInt64(if(isFinite(value), value, 0)), (bitAnd(toUInt64(if(isFinite(value), value, 0)), {p7:UInt64}) != 0) AND (bitAnd(toUInt64(if(isFinite(value), value, 0)), {p8:UInt64}) = 0))) AS cur,
                    count() AS n,
                    countIf((bitAnd(toUInt64(if(isFinite(value), value, 0)), {p7:UInt64}) != 0) AND (bitAnd(toUInt64(if(isFinite(value), value, 0)), {p8:UInt64}) = 0)) AS m
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
                    WHERE (metric_name = {p2:String}) AND ((labels[{p9:String}]) = {p10:String}) AND (timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')) AND (timestamp > (fromUnixTimestamp64Milli({at:Int64}, 'UTC') - toIntervalSecond({p6:UInt32})))
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
        WHERE (n >= {p11:UInt32}) AND (m >= {p3:UInt32})
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
 "p10": "",
 "p11": 1,
 "p2": "gpu_throttle_reasons_active",
 "p3": 2,
 "p4": "gpu_throttle_reasons_active.matches",
 "p5": "gpu_throttle_reasons_active.samples",
 "p6": 1800,
 "p7": 8,
 "p8": 224,
 "p9": "source"
}
